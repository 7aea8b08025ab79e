"""A fake Hugging Face Hub: a real HTTP server that ``huggingface_hub``'s ``create_repo`` and ``upload_folder`` talk to.

It speaks what the installed ``huggingface_hub`` (2.4.0) sends for those calls when the LFS files go over the LFS
protocol (``hf_xet`` absent or ``HF_HUB_DISABLE_XET``; the Xet protocol's content-addressed store is not faked: its
write-token endpoint is a 404, as on a Hub mirror without Xet), keeps repositories, their commits and LFS objects in
memory and logs every request for tests to inspect. The client code each endpoint answers, in
``site-packages/huggingface_hub``:

- ``POST /api/repos/create`` (``hf_api.py`` ``HfApi.create_repo``): ``{"name", "organization", "visibility", "type"}``;
  409 for a repository that exists, with its ``url`` (``create_repo(exist_ok=True)`` takes 409 as "reuse it" and
  returns that URL). A new repository gets an initial commit holding ``.gitattributes`` ("Initial commit is always a
  system commit containing the `.gitattributes` file", ``HfApi.list_repo_commits``), the LFS patterns a new Hub model
  repository starts with.
- ``GET /api/models/{repo}[/revision/{rev}]`` (``HfApi.repo_info``/``model_info``; ``create_repo`` calls it after a
  401/402/403): ``id``, ``private``, ``sha``, ``siblings``.
- ``POST /api/models/{repo}/branch/{branch}`` (``HfApi.create_branch``): 409 when it exists.
- ``POST /api/validate-yaml`` (``HfApi._validate_yaml``, for an uploaded ``README.md``): 400 with ``errors`` when
  the card's YAML front matter does not parse.
- ``POST /api/models/{repo}/preupload/{rev}`` (``_commit_api.py`` ``_fetch_upload_modes``): each file's
  ``uploadMode``, ``shouldIgnore`` and the ``oid`` of the file at that path (what ``CommitOperationAdd._local_oid``
  compares: git's blob sha1 for a regular file, the sha256 for an LFS one). "lfs" for what the Hub keeps in LFS:
  a path the repository's ``.gitattributes`` tracks with ``filter=lfs`` (a 692-byte Parquet file goes to LFS:
  huggingface_hub#3829), a file over 10 MiB, or a binary one, told by the first 512 bytes the client sends as
  ``sample`` (a NUL byte, git's own test). The Hub's commit hook refuses the others as regular files ("Your push was
  rejected because it contains files larger than 10 MiB", huggingface_hub#2666; "... because it contains binary
  files", a 1.67 MB mp4 in qdonnars/ohmywind#289; binary files over 1 MB at first, julien-c in
  huggingface_hub#687), and so does this fake's commit endpoint.
- ``POST /{repo}.git/info/lfs/objects/batch`` (``lfs.py`` ``post_lfs_batch_info``; the git-lfs batch API): an
  object the repository's LFS store lacks gets a ``basic`` upload action, a pre-signed URL pointing back at the fake,
  and a ``verify`` action; a stored one gets no actions (the client skips it, ``_upload_lfs_files``).
- ``PUT`` of the pre-signed URL (``lfs.py`` ``_upload_single_part``): no Authorization header, as with the Hub's
  S3 URLs; the signature in the query, the body's sha256 and its size are checked before the object is stored.
- ``POST /{repo}.git/info/lfs/objects/verify`` (``lfs_upload``'s verify step): 404 for an object not stored.
- ``POST /api/models/{repo}/commit/{rev}`` (``_commit_api.py`` ``_prepare_commit_payload`` and ``_send_commit``):
  NDJSON, a ``header`` line (``summary``, ``description``, ``parentCommit``) then one line per ``file`` (base64
  ``content``), ``lfsFile`` (``oid``, ``size``), ``deletedFile`` or ``deletedFolder``; an ``lfsFile`` whose object
  was not uploaded is refused with the Hub's words (huggingface_hub#3829), a stale ``parentCommit`` with 412.

Every endpoint but the pre-signed PUT wants ``Authorization: Bearer <token>``: none is a 401, an unknown token a 401
with the Hub's ``X-Error-Message: Invalid credentials in Authorization header`` (which ``hf_raise_for_status`` tells
apart from a repository it may not see), a read-only token a 403 where the call writes.

Usage::

    with running_fake_hub(tokens={"hf_w": "write"}) as hub:
        HfApi(endpoint=hub.url, token="hf_w").create_repo("team/m", private=True)
        assert hub.repos["team/m"].private
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import fnmatch
import hashlib
import hmac
import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

# What the .gitattributes of a new Hub model repository tracks in LFS (the file the Hub commits when it creates one,
# as found in repositories it created).
DEFAULT_GITATTRIBUTES = "".join(
    f"{pattern} filter=lfs diff=lfs merge=lfs -text\n"
    for pattern in (
        "*.7z *.arrow *.bin *.bz2 *.ckpt *.ftz *.gz *.h5 *.joblib *.lfs.* *.mlmodel *.model *.msgpack *.npy *.npz "
        "*.onnx *.ot *.parquet *.pb *.pickle *.pkl *.pt *.pth *.rar *.safetensors saved_model/**/* *.tar.* *.tar "
        "*.tflite *.tgz *.wasm *.xz *.zip *.zst *tfevents*"
    ).split()
)
MAX_REGULAR_BYTES = 10 * 2**20  # "files larger than 10 MiB" go to LFS
BINARY_PROBE_BYTES = 8000  # git's buffer_is_binary looks for a NUL byte in the first 8000 bytes
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
_REPO = rf"(?P<repo>{_NAME}/{_NAME})"
_API_REPO = re.compile(rf"^/api/models/{_REPO}(?:/(?P<op>preupload|commit|branch|revision)/(?P<rev>[^/]+))?$")
_LFS = re.compile(rf"^/{_REPO}\.git/info/lfs/objects/(?P<op>batch|verify)$")
_STORAGE = re.compile(rf"^/lfs-storage/{_REPO}/(?P<oid>[0-9a-f]{{64}})$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class LoggedRequest:
    """One request as the fake received it: method, path (no query), query, lower-cased headers, raw body."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class HubFile:
    """A file at a commit: the bytes of a regular file, or the sha256 and size of an LFS one (its bytes are in
    ``Repo.lfs_objects``)."""

    size: int
    content: bytes | None = None
    lfs_oid: str | None = None

    @property
    def oid(self) -> str:
        """What preupload reports as the remote oid (huggingface_hub compares it with ``_local_oid``)."""
        if self.lfs_oid is not None:
            return self.lfs_oid
        assert self.content is not None
        return hashlib.sha1(b"blob %d\0" % len(self.content) + self.content).hexdigest()


@dataclass(frozen=True)
class Commit:
    oid: str
    parent: str | None
    summary: str
    description: str
    files: dict[str, HubFile]


@dataclass
class Repo:
    repo_id: str
    private: bool
    commits: dict[str, Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)  # branch -> head commit oid
    lfs_objects: dict[str, bytes] = field(default_factory=dict)  # sha256 -> content: the repository's LFS store
    created_at: str = ""

    def resolve(self, revision: str) -> Commit | None:
        """The commit a branch name or a commit oid names."""
        oid = self.branches.get(revision, revision)
        return self.commits.get(oid)

    def history(self, branch: str = "main") -> list[Commit]:
        """The branch's commits, newest first."""
        commits, commit = [], self.resolve(branch)
        while commit is not None:
            commits.append(commit)
            commit = self.commits.get(commit.parent) if commit.parent else None
        return commits


class HubError(Exception):
    """An error answer: the status, the Hub's ``{"error": ...}`` body and its X-Error-Code/-Message headers."""

    def __init__(
        self, status: int, message: str, *, code: str | None = None, header_message: bool = False, **extra: Any
    ):
        super().__init__(message)
        self.status, self.message, self.code, self.header_message = status, message, code, header_message
        self.extra = extra  # more fields of the body

    def body(self) -> bytes:
        return json.dumps({"error": self.message, **self.extra}).encode()

    def headers(self) -> dict[str, str]:
        headers = {"X-Error-Code": self.code} if self.code else {}
        if self.header_message:
            headers["X-Error-Message"] = self.message
        return headers


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def lfs_patterns(gitattributes: str) -> list[str]:
    """The path patterns a .gitattributes file tracks with ``filter=lfs``."""
    return [line.split()[0] for line in gitattributes.splitlines() if "filter=lfs" in line.split()[1:]]


def tracked_by_lfs(path: str, patterns: list[str]) -> bool:
    """Whether ``path`` matches one of ``patterns`` as git matches them: a pattern without a slash matches the
    file's name at any depth, one with a slash the whole path."""
    name = path.rsplit("/", 1)[-1]
    return any(
        fnmatch.fnmatchcase(path, p.replace("**/", "*")) if "/" in p else fnmatch.fnmatchcase(name, p) for p in patterns
    )


def is_binary(head: bytes) -> bool:
    return b"\0" in head[:BINARY_PROBE_BYTES]


class FakeHub:
    """The fake's state and its request handling (``handle``); ``running_fake_hub`` serves it over HTTP."""

    def __init__(self, tokens: dict[str, str]) -> None:
        """``tokens``: each valid token and its role, ``"write"`` or ``"read"``."""
        self.tokens = dict(tokens)
        self.url = ""  # set once the server listens
        self.repos: dict[str, Repo] = {}
        self.requests: list[LoggedRequest] = []
        self._secret = hashlib.sha256(repr(id(self)).encode()).digest()  # signs the pre-signed upload URLs
        self._lock = threading.Lock()
        self._counter = 0

    # -- what tests read ----------------------------------------------------------------------------------------------

    def files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        """Every file of ``repo_id`` at ``revision`` with its bytes, LFS objects resolved from the store."""
        commit = self.repos[repo_id].resolve(revision)
        assert commit is not None, f"{repo_id} has no revision {revision}"
        return {
            path: f.content if f.content is not None else self.repos[repo_id].lfs_objects[f.lfs_oid or ""]
            for path, f in commit.files.items()
        }

    def requests_to(self, method: str, path_pattern: str) -> list[LoggedRequest]:
        """The logged requests with this method whose path matches the regular expression ``path_pattern``."""
        return [r for r in self.requests if r.method == method and re.search(path_pattern, r.path)]

    # -- HTTP ----------------------------------------------------------------------------------------------------------

    def handle(
        self, method: str, raw_path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        """Answer one request: status, headers, body."""
        split = urlsplit(raw_path)
        path, query = split.path, parse_qs(split.query)
        headers = {k.lower(): v for k, v in headers.items()}
        with self._lock:
            self.requests.append(LoggedRequest(method, path, query, headers, body))
            try:
                status, answer = self._route(method, path, query, headers, body)
            except HubError as e:
                return e.status, {"Content-Type": "application/json", **e.headers()}, e.body()
        content_type = "application/vnd.git-lfs+json" if _LFS.match(path) else "application/json"
        return status, {"Content-Type": content_type}, json.dumps(answer).encode()

    def _route(
        self, method: str, path: str, query: dict[str, list[str]], headers: dict[str, str], body: bytes
    ) -> tuple[int, Any]:
        if method == "PUT" and (m := _STORAGE.match(path)):
            return self._store_object(m["repo"], m["oid"], query, body)
        if headers.get("authorization") and self._token_role(headers) is None:
            raise HubError(401, "Invalid credentials in Authorization header", header_message=True)
        if method == "POST" and path == "/api/repos/create":
            self._auth(headers, write=True)
            return self._create_repo(_json(body))
        if method == "POST" and path == "/api/validate-yaml":
            self._auth(headers, write=False)
            return self._validate_yaml(_json(body))
        if m := _LFS.match(path):
            if method != "POST":
                raise HubError(405, f"{method} not allowed")
            repo = self._repo(m["repo"], headers, write=True)
            if m["op"] == "batch":
                return self._lfs_batch(repo, _json(body))
            return self._lfs_verify(repo, _json(body))
        if m := _API_REPO.match(path):
            op, rev = m["op"], unquote(m["rev"] or "")
            if method == "GET" and op in (None, "revision"):
                repo = self._repo(m["repo"], headers, write=False)
                return self._repo_info(repo, rev or "main")
            if method == "POST" and op in ("preupload", "commit", "branch"):
                repo = self._repo(m["repo"], headers, write=True)
                if query.get("create_pr"):
                    raise HubError(400, "the fake Hub does not open pull requests")
                if op == "preupload":
                    return self._preupload(repo, rev, _json(body))
                if op == "branch":
                    return self._create_branch(repo, rev, _json(body) if body else {})
                return self._commit(repo, rev, body)
        raise HubError(404, f"{method} {path}: not an endpoint of the fake Hub")

    def _auth(self, headers: dict[str, str], *, write: bool) -> str:
        """The role of the request's bearer token; 401 without a valid one, 403 for a read token where ``write``."""
        role = self._token_role(headers)
        if role is None:
            raise HubError(401, "Unauthorized: an Authorization: Bearer <token> header is required")
        if write and role != "write":
            raise HubError(403, "You don't have the rights to write with a read token", header_message=True)
        return role

    def _token_role(self, headers: dict[str, str]) -> str | None:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        return self.tokens.get(token) if scheme.lower() == "bearer" else None

    def _repo(self, repo_id: str, headers: dict[str, str], *, write: bool) -> Repo:
        """The repository, for a caller whose token may read it (``write``: write to it)."""
        self._auth(headers, write=write)
        repo = self.repos.get(repo_id)
        if repo is None:
            raise HubError(404, "Repository not found", code="RepoNotFound")
        return repo

    def _new_commit(self, repo: Repo, branch: str, parent: Commit | None, summary: str, description: str, files):
        self._counter += 1
        oid = hashlib.sha1(f"{repo.repo_id}\0{branch}\0{self._counter}\0{summary}".encode()).hexdigest()
        repo.commits[oid] = Commit(oid, parent.oid if parent else None, summary, description, dict(files))
        repo.branches[branch] = oid
        return oid

    # -- endpoints ----------------------------------------------------------------------------------------------------

    def _create_repo(self, payload: dict) -> tuple[int, Any]:
        name, organization = payload.get("name"), payload.get("organization")
        if not isinstance(name, str) or not re.fullmatch(_NAME, name) or ".." in name or "--" in name:
            raise HubError(400, f"Invalid repo name: {name!r}")
        if not isinstance(organization, str) or not re.fullmatch(_NAME, organization):
            raise HubError(400, "the fake Hub has no user behind a token: name the namespace (organization)")
        if payload.get("type", "model") != "model":
            raise HubError(400, f"the fake Hub holds model repositories only, not {payload['type']!r}")
        visibility = payload.get("visibility", "public")  # no visibility: public, the Hub's default
        if visibility not in ("public", "private"):
            raise HubError(400, f"Invalid visibility: {visibility!r}")
        repo_id = f"{organization}/{name}"
        if repo_id in self.repos:
            # With the repository's URL, which create_repo(exist_ok=True) returns.
            raise HubError(409, "You already created this model repo", url=f"{self.url}/{repo_id}")
        repo = self.repos[repo_id] = Repo(repo_id, private=visibility == "private", created_at=_now())
        attributes = DEFAULT_GITATTRIBUTES.encode()
        self._new_commit(
            repo, "main", None, "initial commit", "", {".gitattributes": HubFile(len(attributes), content=attributes)}
        )
        return 200, {"url": f"{self.url}/{repo_id}", "name": repo_id, "id": repo_id}

    def _repo_info(self, repo: Repo, revision: str) -> tuple[int, Any]:
        commit = repo.resolve(revision)
        if commit is None:
            raise HubError(404, f"Invalid rev id: {revision}", code="RevisionNotFound")
        return 200, {
            "_id": hashlib.sha1(repo.repo_id.encode()).hexdigest()[:24],
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "author": repo.repo_id.split("/")[0],
            "sha": commit.oid,
            "private": repo.private,
            "gated": False,
            "disabled": False,
            "createdAt": repo.created_at,
            "lastModified": repo.created_at,
            "tags": [],
            "siblings": [{"rfilename": path} for path in sorted(commit.files)],
        }

    def _create_branch(self, repo: Repo, branch: str, payload: dict) -> tuple[int, Any]:
        if branch in repo.branches:
            raise HubError(409, f"Reference already exists: refs/heads/{branch}")
        start = repo.resolve(payload.get("startingPoint") or "main")
        if start is None:
            raise HubError(404, "Invalid rev id", code="RevisionNotFound")
        repo.branches[branch] = start.oid
        return 200, {}

    @staticmethod
    def _validate_yaml(payload: dict) -> tuple[int, Any]:
        content = payload.get("content", "")
        if content.startswith("---"):
            front, _, _ = content[3:].partition("\n---")
            try:
                yaml.safe_load(front)
            except yaml.YAMLError as e:
                return 400, {"errors": [{"message": f"Invalid YAML in the metadata: {e}"}], "warnings": []}
        return 200, {"errors": [], "warnings": []}

    def _preupload(self, repo: Repo, revision: str, payload: dict) -> tuple[int, Any]:
        commit = repo.resolve(revision)
        if commit is None:
            raise HubError(404, f"Invalid rev id: {revision}", code="RevisionNotFound")
        attributes = commit.files.get(".gitattributes")
        patterns = lfs_patterns(attributes.content.decode()) if attributes and attributes.content else []
        files = payload.get("files")
        if not isinstance(files, list):
            raise HubError(400, "files: expected an array")
        answers = []
        for f in files:
            if not (isinstance(f, dict) and isinstance(f.get("path"), str) and isinstance(f.get("size"), int)):
                raise HubError(400, f"each file needs a path and a size, got {f!r}")
            sample = base64.b64decode(f.get("sample", ""), validate=True)
            lfs = tracked_by_lfs(f["path"], patterns) or f["size"] > MAX_REGULAR_BYTES or is_binary(sample)
            answer = {"path": f["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False}
            if (existing := commit.files.get(f["path"])) is not None:
                answer["oid"] = existing.oid
            answers.append(answer)
        return 200, {"files": answers, "commitOid": commit.oid}

    def _lfs_batch(self, repo: Repo, payload: dict) -> tuple[int, Any]:
        if payload.get("operation") != "upload":
            raise HubError(422, "the fake Hub's batch API only uploads")
        if "basic" not in payload.get("transfers", ["basic"]) or payload.get("hash_algo", "sha256") != "sha256":
            raise HubError(422, "the fake Hub offers the basic transfer of sha256 objects only")
        ref = (payload.get("ref") or {}).get("name")
        if ref is not None and repo.resolve(ref) is None:
            raise HubError(404, f"Invalid rev id: {ref}", code="RevisionNotFound")
        objects = []
        for obj in payload.get("objects", []):
            oid, size = obj.get("oid"), obj.get("size")
            if not (isinstance(oid, str) and _SHA256.match(oid) and isinstance(size, int) and size >= 0):
                raise HubError(422, f"objects: expected a sha256 oid and a size, got {obj!r}")
            answer: dict[str, Any] = {"oid": oid, "size": size}
            stored = repo.lfs_objects.get(oid)
            if stored is None or len(stored) != size:
                signed = f"{self.url}/lfs-storage/{repo.repo_id}/{oid}?{self._signature(repo.repo_id, oid, size)}"
                answer["authenticated"] = True
                answer["actions"] = {
                    "upload": {"href": signed, "expires_in": 900},
                    "verify": {"href": f"{self.url}/{repo.repo_id}.git/info/lfs/objects/verify"},
                }
            objects.append(answer)
        return 200, {"transfer": "basic", "objects": objects, "hash_algo": "sha256"}

    def _signature(self, repo_id: str, oid: str, size: int) -> str:
        digest = hmac.new(self._secret, f"{repo_id}:{oid}:{size}".encode(), hashlib.sha256).hexdigest()
        return f"X-Size={size}&X-Signature={digest}"

    def _store_object(self, repo_id: str, oid: str, query: dict[str, list[str]], body: bytes) -> tuple[int, Any]:
        size = int((query.get("X-Size") or ["-1"])[0])
        signature = (query.get("X-Signature") or [""])[0]
        if repo_id not in self.repos or f"X-Size={size}&X-Signature={signature}" != self._signature(repo_id, oid, size):
            raise HubError(403, "SignatureDoesNotMatch")
        if len(body) != size or hashlib.sha256(body).hexdigest() != oid:
            raise HubError(400, f"BadDigest: got {len(body)} bytes with sha256 {hashlib.sha256(body).hexdigest()}")
        self.repos[repo_id].lfs_objects[oid] = body
        return 200, {}

    @staticmethod
    def _lfs_verify(repo: Repo, payload: dict) -> tuple[int, Any]:
        stored = repo.lfs_objects.get(payload.get("oid", ""))
        if stored is None or len(stored) != payload.get("size"):
            raise HubError(404, f"Object {payload.get('oid')} not found")
        return 200, {}

    def _commit(self, repo: Repo, revision: str, body: bytes) -> tuple[int, Any]:
        head = repo.resolve(revision)
        if head is None or revision not in repo.branches:
            raise HubError(404, f"Invalid rev id: {revision}", code="RevisionNotFound")
        lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, "the first line of a commit must be its header")
        header = lines[0].get("value") or {}
        summary = header.get("summary")
        if not isinstance(summary, str) or not summary.strip():
            raise HubError(400, "summary: a commit needs a message")
        if header.get("parentCommit") not in (None, head.oid):
            raise HubError(412, "A commit has happened since. Please refresh and try again.")
        files = dict(head.files)
        too_large, binary, missing = [], [], []
        for line in lines[1:]:
            key, value = line.get("key"), line.get("value") or {}
            path = value.get("path")
            if not isinstance(path, str) or not path or path.startswith("/"):
                raise HubError(400, f"{key}: invalid path {path!r}")
            if key == "file":
                if value.get("encoding") != "base64":
                    raise HubError(400, f"{path}: the fake Hub takes base64 content only")
                content = base64.b64decode(value.get("content", ""), validate=True)
                if len(content) > MAX_REGULAR_BYTES:
                    too_large.append(path)
                elif is_binary(content):
                    binary.append(path)
                files[path] = HubFile(len(content), content=content)
            elif key == "lfsFile":
                oid, size = value.get("oid"), value.get("size")
                if value.get("algo") != "sha256" or not isinstance(oid, str) or not _SHA256.match(oid):
                    raise HubError(400, f"{path}: an lfsFile needs a sha256 oid")
                stored = repo.lfs_objects.get(oid)
                if stored is None or (size is not None and len(stored) != size):
                    missing.append(path)
                    continue
                files[path] = HubFile(len(stored), lfs_oid=oid)
            elif key == "deletedFile":
                if files.pop(path, None) is None:
                    raise HubError(404, "A file with this name doesn't exist", code="EntryNotFound")
            elif key == "deletedFolder":
                files = {p: f for p, f in files.items() if not p.startswith(path.rstrip("/") + "/")}
            else:
                raise HubError(400, f"unknown commit line {key!r}")
        for offending, why in (
            (
                missing,
                "an LFS pointer pointed to a file that does not exist. For instance, this can happen if you "
                "used git push --no-verify to push your changes.",
            ),
            (
                too_large,
                "it contains files larger than 10 MiB. Please use https://git-lfs.github.com/ to store large files.",
            ),
            (binary, "it contains binary files. Please use https://huggingface.co/docs/hub/xet to store binary files."),
        ):
            if offending:
                listed = " ".join(f"- {p}" for p in offending)
                raise HubError(400, f"Your push was rejected because {why} Offending files: {listed}")
        oid = self._new_commit(repo, revision, head, summary, header.get("description", ""), files)
        return 200, {
            "success": True,
            "commitOid": oid,
            "commitUrl": f"{self.url}/{repo.repo_id}/commit/{oid}",
            "hookOutput": "",
        }


def _json(body: bytes) -> dict:
    try:
        value = json.loads(body or b"{}")
    except ValueError:
        raise HubError(400, "the body is not JSON") from None
    if not isinstance(value, dict):
        raise HubError(400, "the body is not a JSON object")
    return value


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as httpx pools connections
    timeout = 10  # lets idle keep-alive handler threads end
    disable_nagle_algorithm = True
    server: _FakeHttpServer

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline().strip():  # trailers, then the empty line
                pass
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _serve(self) -> None:
        status, headers, body = self.server.hub.handle(
            self.command, self.path, dict(self.headers.items()), self._body()
        )
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = _serve

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - BaseHTTPRequestHandler's name
        """Stay quiet: tests read ``FakeHub.requests`` instead of the access log."""


class _FakeHttpServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, hub: FakeHub) -> None:
        super().__init__(("127.0.0.1", 0), _RequestHandler)
        self.hub = hub


@contextlib.contextmanager
def running_fake_hub(*, tokens: dict[str, str]) -> Iterator[FakeHub]:
    """Run a fake Hub on 127.0.0.1 in a background thread for the duration of the block.

    Args:
        tokens: Each token the fake accepts and its role: ``"write"`` or ``"read"``.

    Yields:
        The fake, with ``url`` set (pass it as the endpoint), its repositories and their LFS objects, its request log.
    """
    hub = FakeHub(tokens)
    server = _FakeHttpServer(hub)
    host, port = server.server_address[:2]
    hub.url = f"http://{host}:{port}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, name="fake-hub", daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
