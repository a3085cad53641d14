"""Load policies from a directory or from ConfigMap data; every error names file and line.

The registry keeps the last good version of each file: a file that turns bad is reported and
its previous policies keep running, and the other files are unaffected (safety: bad input never
takes down what already works). Files named ``*suite.yaml`` hold test examples, not policies.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from pydantic import ValidationError

from auditor.errors import BadInput
from auditor.policy.schema import GATE_KIND, GatePolicy, Policy
from auditor.yamldoc import MAX_BYTES, Located, YamlError, load_documents

log = logging.getLogger(__name__)


class PolicyError(BadInput):
    """One or more policy documents are invalid; ``problems`` are ``file:line: message`` strings."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid policy:\n  " + "\n  ".join(problems))
        self.problems = problems


def _is_policy_file(name: str) -> bool:
    base = os.path.basename(name)
    return (
        base.endswith((".yaml", ".yml")) and not base.startswith(".") and not base.endswith(("suite.yaml", "suite.yml"))
    )


def _loc_path(doc: Located, loc: tuple) -> tuple:
    # pydantic reports the input keys (aliases) it failed on; drop the model-internal markers
    return tuple(p for p in loc if not (isinstance(p, str) and ("[" in p or p.startswith("function-"))))


#: a policy document of either kind
AnyPolicy = Policy | GatePolicy


def parse_policies(text: str, source: str) -> list[Policy]:
    """The ``GpuPolicy`` documents of ``text``, every document validated (:func:`parse_documents`)."""
    return [p for p in parse_documents(text, source) if isinstance(p, Policy)]


def parse_gate_policies(text: str, source: str) -> list[GatePolicy]:
    """The ``GatePolicy`` documents (gate rules) of ``text``, every document validated."""
    return [p for p in parse_documents(text, source) if isinstance(p, GatePolicy)]


def parse_documents(text: str, source: str) -> list[AnyPolicy]:
    """Parse and validate every document in ``text`` (``kind: GpuPolicy`` or ``kind: GatePolicy``);
    raise :class:`PolicyError` with file:line."""
    try:
        docs = load_documents(text, source)
    except YamlError as exc:
        raise PolicyError([f"{source}:{exc.line}: not valid YAML: {exc}"]) from None
    problems: list[str] = []
    out: list[AnyPolicy] = []
    for doc in docs:
        if doc.value is None:
            continue
        if not isinstance(doc.value, dict):
            problems.append(f"{source}:{doc.line}: a policy document must be a mapping")
            continue
        try:
            model: type[AnyPolicy] = GatePolicy if doc.value.get("kind") == GATE_KIND else Policy
            out.append(model.model_validate(doc.value))
        except ValidationError as exc:
            found = []
            for err in exc.errors():
                path = _loc_path(doc, tuple(err["loc"]))
                where = ".".join(str(p) for p in path) or "(document)"
                msg = err["msg"].removeprefix("Value error, ")
                if err["type"] == "extra_forbidden":
                    msg = "unknown field"
                elif err["type"] == "missing":
                    msg = "required" + (f": {REQUIRED_HINTS[path[-1]]}" if path and path[-1] in REQUIRED_HINTS else "")
                found.append((doc.line_of(path), f"{source}:{doc.line_of(path)}: {where}: {msg}"))
            problems += [m for _, m in sorted(found, key=lambda x: x[0])]
    if problems:
        raise PolicyError(problems)
    return out


#: what to write where a required key is missing (docs/policies.md says the same)
REQUIRED_HINTS = {
    "escalation": "the ordered action steps, at least one, e.g. escalation: [{actions: [annotate, event]}] "
    "(in mode audit they are recorded as what would have run)",
    "action": "what the gate rule does to a re-submission: hold (until acknowledged) or deprioritize",
}


class PolicyFiles(dict[str, str]):
    """Policy files (path → text) of which ``shipped`` are the policies shipped with gpu-auditor.

    A policy in another file (the admin's ``policies.dir``) with the name of a shipped one
    replaces it: an admin tones down or tightens one shipped policy without forking them all.
    Two definitions of one name among the admin's files (or among the shipped ones) are still
    refused, as in any plain mapping of files.
    """

    def __init__(self, files: Mapping[str, str] | None = None, *, shipped: Iterable[str] = ()) -> None:
        super().__init__(files or {})
        self.shipped = frozenset(shipped)


def layered(shipped: Mapping[str, str], admin: Mapping[str, str]) -> PolicyFiles:
    """The shipped files with the admin's over them (a file at the same path is the admin's)."""
    return PolicyFiles({**shipped, **admin}, shipped=(name for name in shipped if name not in admin))


def _overrides(
    loaded: list[tuple[str, AnyPolicy]], files: Mapping[str, str]
) -> tuple[list[tuple[str, AnyPolicy]], list[str]]:
    """``loaded`` less the shipped policies that a policy of the same name in an admin file
    replaces, and one line per replacement (``file:line: policy 'x' replaces the shipped one in file:line``)."""
    shipped: frozenset[str] = getattr(files, "shipped", frozenset())
    if not shipped:
        return loaded, []
    admin_at: dict[str, str] = {}
    for src, p in loaded:
        if src not in shipped:
            admin_at.setdefault(p.name, src)
    kept, notes = [], []
    for src, p in loaded:
        if src in shipped and p.name in admin_at:
            by, was = _where_named(files, admin_at[p.name], p.name), _where_named(files, src, p.name)
            notes.append(f"{by}: policy {p.name!r} replaces the shipped one in {was}")
        else:
            kept.append((src, p))
    return kept, notes


def shipped_overrides(files: Mapping[str, str], shipped_dir: str | Path) -> list[str]:
    """Which policies of ``files`` (an admin's) replace shipped ones in ``shipped_dir``, one
    line each (``policy validate`` says so); none when that directory is missing or is ``files``'."""
    if not Path(shipped_dir).is_dir():
        return []
    given = {Path(n).resolve() for n in files}  # a shipped file validated by itself is no override
    shipped = {n: t for n, t in read_dir(shipped_dir).items() if Path(n).resolve() not in given}
    return load_layered(layered(shipped, files))[1]


def _check_unique(policies: Iterable[tuple[str, AnyPolicy]], files: Mapping[str, str]) -> list[str]:
    seen: dict[str, str] = {}
    problems = []
    for src, p in policies:
        here = _where_named(files, src, p.name)
        if p.name in seen:
            problems.append(f"{here}: policy {p.name!r} is already defined in {seen[p.name]}")
        else:
            seen[p.name] = here
    return problems


def _where_named(files: Mapping[str, str], source: str, name: str) -> str:
    """``file:line`` of the ``metadata.name`` that names policy ``name`` in ``source`` (only a
    duplicate's message needs it, so the file is parsed again only then)."""
    try:
        for doc in load_documents(files[source], source):
            meta = doc.value.get("metadata") if isinstance(doc.value, dict) else None
            if isinstance(meta, dict) and meta.get("name") == name:
                return f"{source}:{doc.line_of(('metadata', 'name'))}"
    except (YamlError, KeyError):
        pass
    return source


def load_files(files: Mapping[str, str]) -> list[Policy]:
    """Validate a set of files (name → text, e.g. ConfigMap data) all-or-nothing; the ``GpuPolicy`` documents."""
    return [p for p in load_all(files) if isinstance(p, Policy)]


def load_gate_files(files: Mapping[str, str]) -> list[GatePolicy]:
    """The gate rules of a set of files, validated all-or-nothing like :func:`load_files`."""
    return [p for p in load_all(files) if isinstance(p, GatePolicy)]


def load_all(files: Mapping[str, str]) -> list[AnyPolicy]:
    """Every document of both kinds in a set of files, all-or-nothing; names are unique across
    kinds, except that an admin's policy replaces a shipped one of its name (:class:`PolicyFiles`;
    each replacement is logged)."""
    documents, notes = load_layered(files)
    for note in notes:
        log.warning("%s", note)
    return documents


def load_layered(files: Mapping[str, str]) -> tuple[list[AnyPolicy], list[str]]:
    """:func:`load_all`'s documents and the lines saying which shipped policies were replaced."""
    problems: list[str] = []
    loaded: list[tuple[str, AnyPolicy]] = []
    for name in sorted(files):
        if not _is_policy_file(name):
            continue
        try:
            loaded += [(name, p) for p in parse_documents(files[name], name)]
        except PolicyError as exc:
            problems += exc.problems
    loaded, notes = _overrides(loaded, files)
    problems += _check_unique(loaded, files)
    if problems:
        raise PolicyError(problems)
    return [p for _, p in loaded], notes


def _read(path: Path) -> str:
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise BadInput(f"{path}: {size:,} bytes, more than the {MAX_BYTES:,} a policy file may have")
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: cannot read: {exc}") from None


def read_dir(directory: str | Path) -> dict[str, str]:
    """All policy files under ``directory`` (recursively, hidden entries skipped), path → text."""
    root = Path(directory)
    if not root.is_dir():
        raise BadInput(f"{directory}: not a directory of policies")
    files: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for f in sorted(filenames):
            if _is_policy_file(f):
                files[str(Path(dirpath) / f)] = _read(Path(dirpath) / f)
    return files


def read_path(path: str | Path) -> dict[str, str]:
    """One policy file, or every policy file under a directory (:func:`read_dir`), path → text.

    A file named explicitly must be a policy file: an example suite or a non-YAML file is refused
    rather than skipped, so ``policy validate suite.yaml`` never reports "0 policies valid"."""
    p = Path(path)
    if p.is_dir():
        return read_dir(p)
    if not p.exists():
        raise BadInput(f"{path}: no such file or directory")
    if p.name.endswith(("suite.yaml", "suite.yml")):
        raise BadInput(f"{path}: an example suite, not a policy (validate the policy file next to it)")
    if not _is_policy_file(p.name):
        raise BadInput(f"{path}: not a policy file (policies are .yaml or .yml)")
    return {str(p): _read(p)}


def load_dir(directory: str | Path) -> list[Policy]:
    """Validate every policy file under ``directory`` all-or-nothing (``policy validate``)."""
    return load_files(read_dir(directory))


@dataclass
class PolicyRegistry:
    """The running set of policies, reloaded file by file; a bad file keeps its last good version."""

    _good: dict[str, list[AnyPolicy]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    #: the shipped policies that an admin's file replaces, one line each (as last logged)
    overrides: list[str] = field(default_factory=list)
    #: each file's last text and what parsing it gave (policies, or the problems): the operator
    #: re-reads the directory every cycle, and only a changed file is parsed again.
    _parsed: dict[str, tuple[str, list[AnyPolicy] | None, list[str]]] = field(default_factory=dict)

    def update(self, files: Mapping[str, str]) -> list[str]:
        """Take a new view of the files; return (and keep in ``errors``) the problems found.

        New good files replace their old version; removed files drop their policies; a bad file
        keeps its previous version (or none, if it never loaded). A policy name defined in two
        files keeps the earlier file's definition, except that an admin's file replaces a shipped
        one (:class:`PolicyFiles`; logged once, when the replacement first appears).
        """
        problems: list[str] = []
        good: dict[str, list[AnyPolicy]] = {}
        for name in sorted(files):
            if not _is_policy_file(name):
                continue
            parsed, bad = self._parse(name, files[name])
            if parsed is not None:
                good[name] = parsed
            else:
                problems += bad
                if name in self._good:
                    good[name] = self._good[name]
                    log.warning("policy file %s is invalid; its last good version keeps running", name)
        loaded, notes = _overrides([(name, p) for name in sorted(good) for p in good[name]], files)
        for note in notes:
            if note not in self.overrides:
                log.warning("%s", note)
        self.overrides = notes
        names: dict[str, str] = {}
        for name in sorted(good):
            kept = []
            for p in (p for src, p in loaded if src == name):
                if p.name in names:
                    where, first = _where_named(files, name, p.name), _where_named(files, names[p.name], p.name)
                    problems.append(f"{where}: policy {p.name!r} is already defined in {first}; ignored")
                    continue
                names[p.name] = name
                kept.append(p)
            good[name] = kept
        self._good = good
        self._parsed = {n: v for n, v in self._parsed.items() if n in files}
        self.errors = problems
        for pr in problems:
            log.error("%s", pr)
        return problems

    def _parse(self, name: str, text: str) -> tuple[list[AnyPolicy] | None, list[str]]:
        cached = self._parsed.get(name)
        if cached is not None and cached[0] == text:
            return cached[1], cached[2]
        try:
            result: tuple[list[AnyPolicy] | None, list[str]] = (parse_documents(text, name), [])
        except PolicyError as exc:
            result = (None, exc.problems)
        self._parsed[name] = (text, *result)
        return result

    def reload_dir(self, directory: str | Path) -> list[str]:
        """:meth:`update` from a directory (a mounted ConfigMap or ``policies/``)."""
        return self.update(read_dir(directory))

    @property
    def policies(self) -> list[Policy]:
        return [p for name in sorted(self._good) for p in self._good[name] if isinstance(p, Policy)]

    @property
    def gate_policies(self) -> list[GatePolicy]:
        """The gate rules of the running files (the efficiency gate reads them)."""
        return [p for name in sorted(self._good) for p in self._good[name] if isinstance(p, GatePolicy)]
