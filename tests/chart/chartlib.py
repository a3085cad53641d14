"""Chart-test helpers (imported by the tests and by conftest.py): the real helm and kubectl binaries of the test bed, run against its apiserver.

The session fixture `testbed` (tests/conftest.py) provides the binaries and the kubeconfig; these
helpers only wrap them, so every test talks to the real programs.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gpu-auditor"
FULL_VALUES = CHART / "ci" / "full-values.yaml"


@dataclass(frozen=True)
class Result:
    rc: int
    out: str
    err: str


class ToolError(AssertionError):
    """A helm/kubectl call that should have worked failed; carries its stderr."""


@dataclass
class Chart:
    """Runs helm and kubectl for the tests, always with the test bed's kubeconfig."""

    helm_bin: str
    kubectl_bin: str
    kubeconfig: str

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["KUBECONFIG"] = self.kubeconfig
        # Keep helm's caches and config out of the user's home.
        for var, sub in (("HELM_CACHE_HOME", "cache"), ("HELM_CONFIG_HOME", "config"), ("HELM_DATA_HOME", "data")):
            env.setdefault(var, str(ROOT / ".testbed" / "helm" / sub))
        return env

    def run(self, argv: list[str], *, input: str | None = None, check: bool = True, timeout: float = 120) -> Result:
        proc = subprocess.run(argv, input=input, capture_output=True, text=True, env=self._env(), timeout=timeout)
        res = Result(proc.returncode, proc.stdout, proc.stderr)
        if check and proc.returncode != 0:
            raise ToolError(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr}{proc.stdout}")
        return res

    def helm(self, *args: str, check: bool = True, timeout: float = 120) -> Result:
        return self.run([self.helm_bin, *args], check=check, timeout=timeout)

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> Result:
        return self.run([self.kubectl_bin, *args], input=input, check=check)

    @staticmethod
    def value_args(values: Iterable[Path | str] = (), sets: Iterable[str] = ()) -> list[str]:
        args: list[str] = []
        for v in values:
            args += ["-f", str(v)]
        for s in sets:
            args += ["--set", s]
        return args

    def template_text(
        self,
        *,
        namespace: str = "gpu-auditor",
        release: str = "ga",
        values: Iterable[Path | str] = (),
        sets: Iterable[str] = (),
        check: bool = True,
    ) -> Result:
        return self.helm(
            "template", release, str(CHART), "--namespace", namespace, *self.value_args(values, sets), check=check
        )

    def render(self, **kw: Any) -> list[dict]:
        """The rendered objects (empty documents dropped)."""
        return [d for d in yaml.safe_load_all(self.template_text(**kw).out) if d]


def find(objs: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def pod_specs(objs: list[dict]) -> list[dict]:
    return [
        o["spec"]["template"]["spec"] for o in objs if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet", "Job")
    ]


def drop_release(chart: Chart, namespace: str, release: str) -> None:
    """Uninstall (cluster-scoped objects outlive the namespace) and delete the kept PVCs. No
    pvc-protection controller runs in the test bed, so their finalizer is cleared by hand, or
    the namespace would never finish terminating."""
    chart.helm("uninstall", release, "-n", namespace, "--ignore-not-found", check=False)
    pvcs = chart.kubectl("get", "pvc", "-n", namespace, "-o", "name", check=False).out.split()
    for pvc in pvcs:
        chart.kubectl(
            "patch", pvc, "-n", namespace, "--type=merge", "-p", '{"metadata":{"finalizers":null}}', check=False
        )
        chart.kubectl("delete", pvc, "-n", namespace, "--wait=false", check=False)


class ServiceAccount:
    """kubectl as the chart's ServiceAccount, with the groups its token would carry."""

    def __init__(self, chart: Chart, namespace: str, name: str, api_client) -> None:
        self.chart, self.namespace, self.api_client = chart, namespace, api_client
        self.user = f"system:serviceaccount:{namespace}:{name}"
        self.groups = ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"]
        self.as_args = [
            f"--as=system:serviceaccount:{namespace}:{name}",
            "--as-group=system:serviceaccounts",
            f"--as-group=system:serviceaccounts:{namespace}",
            "--as-group=system:authenticated",
        ]

    def can(self, *args: str) -> bool:
        res = self.chart.kubectl("auth", "can-i", *args, *self.as_args, check=False)
        assert res.out.strip() in ("yes", "no"), res.out + res.err
        return res.out.strip() == "yes"

    def sar(self, verb: str, group: str, resource: str) -> bool:
        """A SubjectAccessReview (cluster-wide), for kinds whose CRD the test bed lacks: kubectl
        auth can-i needs discovery to know a resource, the authorizer does not."""
        from kubernetes import client

        review = client.V1SubjectAccessReview(
            spec=client.V1SubjectAccessReviewSpec(
                user=self.user,
                groups=self.groups,
                resource_attributes=client.V1ResourceAttributes(verb=verb, group=group, resource=resource),
            )
        )
        return client.AuthorizationV1Api(self.api_client).create_subject_access_review(review).status.allowed

    def run(self, *args: str, input: str | None = None, ok: bool = True) -> str:
        res = self.chart.kubectl(*args, *self.as_args, input=input, check=False)
        if ok:
            assert res.rc == 0, f"kubectl {' '.join(args)} as the ServiceAccount: {res.err}"
        else:
            assert res.rc != 0 and "forbidden" in res.err.lower(), (
                f"kubectl {' '.join(args)} should be Forbidden: {res.err or res.out}"
            )
        return res.out

    def run_once_admitted(self, *args: str, input: str | None = None, within_s: float = 30.0) -> str:
        """Run a call that a `helm upgrade` just allowed. The apiserver applies new RBAC and a
        changed ValidatingAdmissionPolicy from its informers, a moment after the objects change,
        so the first call may still meet the old rules: retry it until the new ones hold."""
        deadline = time.monotonic() + within_s
        while True:
            res = self.chart.kubectl(*args, *self.as_args, input=input, check=False)
            if res.rc == 0:
                return res.out
            assert time.monotonic() < deadline, f"kubectl {' '.join(args)} as the ServiceAccount: {res.err}"
            time.sleep(0.5)

    def can_within(self, expected: bool, *args: str, within_s: float = 30.0) -> bool:
        """`can`, waiting up to `within_s` for the authorizer's cache to reach `expected`."""
        deadline = time.monotonic() + within_s
        while self.can(*args) != expected and time.monotonic() < deadline:
            time.sleep(0.5)
        return self.can(*args)
