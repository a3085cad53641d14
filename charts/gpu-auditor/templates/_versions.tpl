{{- /*
Kubernetes version floors (docs/install.md, "Version floors"). The chart as a whole needs
Chart.yaml's kubeVersion (helm refuses an older cluster before rendering); an optional part that
needs a newer API has its floor here and fails with the value that switches it on, the version it
needs and the cluster's version. Each floor is proven on a real apiserver of that version
(tests/chart/test_floor_apiserver.py for 1.30, the test bed's apiserver for 1.36).

  rbac.writeFence.enabled        admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy: GA in 1.30
  gate.holdBeforeQuota.enabled   admissionregistration.k8s.io/v1 MutatingAdmissionPolicy: GA in 1.36
                                 (1.34 and 1.35 have only v1beta1, behind a feature gate that is off
                                 by default, and beta APIs are not served unless switched on)

.Capabilities.KubeVersion is the server's on install and upgrade, --kube-version (or helm's own
default) with `helm template`. .Capabilities.APIVersions tells the truth only when it came from
the apiserver's discovery, which lists kinds ("apps/v1/Deployment"); `helm template` lists
group-versions alone, so the API check below runs only when kinds are listed: it catches an API
that a new enough cluster has switched off (--runtime-config).
*/ -}}

{{- define "gpu-auditor.floors" -}}
writeFence:
  value: rbac.writeFence.enabled=true
  minor: 30
  api: admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy
  what: ValidatingAdmissionPolicy v1
  otherwise: set rbac.writeFence.enabled=false to rely on RBAC alone
holdBeforeQuota:
  value: gate.holdBeforeQuota.enabled=true
  minor: 36
  api: admissionregistration.k8s.io/v1/MutatingAdmissionPolicy
  what: MutatingAdmissionPolicy v1; 1.34 and 1.35 serve only v1beta1, and only when switched on
  otherwise: set it false to hold through the AdmissionCheck alone
{{- end }}

{{- /* "true" when .Capabilities.APIVersions came from the apiserver's discovery (it names kinds). */ -}}
{{- define "gpu-auditor.discovered" -}}
{{- $found := false }}
{{- range .Capabilities.APIVersions }}
{{- if regexMatch "/[A-Z][A-Za-z0-9]*$" . }}{{ $found = true }}{{ end }}
{{- end }}
{{- $found -}}
{{- end }}

{{- /*
Fails unless the cluster meets the floor of one optional part. Call with
(dict "ctx" $ "part" "writeFence"); renders nothing.
*/ -}}
{{- define "gpu-auditor.requireFloor" -}}
{{- $f := get (include "gpu-auditor.floors" . | fromYaml) .part }}
{{- $caps := .ctx.Capabilities }}
{{- $have := $caps.KubeVersion.Version }}
{{- if not (semverCompare (printf ">=1.%d.0-0" (int $f.minor)) $have) }}
{{- fail (printf "%s needs Kubernetes >= 1.%d (%s); this cluster is %s. Upgrade the cluster, or %s" $f.value (int $f.minor) $f.what $have $f.otherwise) }}
{{- end }}
{{- if and (eq (include "gpu-auditor.discovered" .ctx) "true") (not ($caps.APIVersions.Has $f.api)) }}
{{- fail (printf "%s needs %s, which this cluster (%s) does not serve (switched off by the apiserver's --runtime-config?). Serve it, or %s" $f.value $f.api $have $f.otherwise) }}
{{- end }}
{{- end }}
