"""The efficiency gate's Kueue half: the AdmissionCheck controller and the admission use-case.

``admission`` decides what one Workload's check says (pure use-case over the ports in ``ports``);
``kueue`` is the Kubernetes adapter (AdmissionCheck ``Active``, Workload check states by
server-side apply, Events, annotations); ``holds`` keeps the GateHolds object that the chart's
MutatingAdmissionPolicy reads to gate re-submissions before they take quota, and releases them;
``controller`` runs it all from watches under the operator's leader election.
"""
