"""A small Hugging Face Hub server for tests: the HTTP API that the real
`huggingface_hub` client uses to create repositories, commit (with git-LFS
batch uploads), branch, tag and download (see ../shared/docs/HUB_API.md).

Repositories live in memory: commits with real 40-hex ids and parents,
branches and tags, blobs addressed by git sha1 (regular files) or sha256
(LFS files). Private repositories answer only to a known token, like the
Hub: without one, 401 with ``X-Error-Code: RepoNotFound``.

Start it with `HubServer(port).start()`; `server.requests` logs
``(method, path)`` of every request.
"""

import base64
import hashlib
import http.server
import json
import os
import threading
import time
import urllib.parse

LFS_SUFFIXES = (".h5", ".safetensors", ".model", ".bin", ".keras")
GITATTRIBUTES = "".join(
    f"*{suffix} filter=lfs diff=lfs merge=lfs -text\n"
    for suffix in LFS_SUFFIXES
).encode()


def git_sha1(content):
    header = f"blob {len(content)}\0".encode()
    return hashlib.sha1(header + content).hexdigest()


def lfs_pointer(sha256, size):
    return (
        "version https://git-lfs.github.com/spec/v1\n"
        f"oid sha256:{sha256}\nsize {size}\n"
    ).encode()


class HubError(Exception):
    def __init__(self, status, code, message):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class Repo:
    def __init__(self, repo_id, private, owner):
        self.repo_id, self.private, self.owner = repo_id, private, owner
        self.commits = {}  # sha -> {parent, files, title, date}
        self.branches = {}
        self.tags = {}
        self.pull_requests = 0

    def resolve(self, revision):
        if revision in self.branches:
            return self.branches[revision]
        if revision in self.tags:
            return self.tags[revision]
        if revision in self.commits:
            return revision
        raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")


class HubState:
    """Repositories, blobs and tokens, behind one lock."""

    def __init__(self, tokens):
        self.tokens = dict(tokens)  # token -> user name
        self.repos = {}
        self.blobs = {}  # git sha1 or sha256 -> bytes
        self.pending_lfs = {}  # sha256 -> bytes uploaded, not verified
        self.lock = threading.RLock()
        self.counter = 0
        # Commit ids differ from one server to the next, as on the Hub,
        # so that a client cache kept between test runs never matches.
        self.salt = os.urandom(8).hex()

    def new_commit(self, repo, parent, files, title):
        self.counter += 1
        digest = hashlib.sha1(
            json.dumps(
                [
                    self.salt,
                    repo.repo_id,
                    parent,
                    sorted(files.items()),
                    title,
                    self.counter,
                ]
            ).encode()
        ).hexdigest()
        repo.commits[digest] = {
            "parent": parent,
            "files": files,  # path -> {"sha1", "size", "lfs": sha256|None}
            "title": title,
            "date": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime()),
        }
        return digest

    def store(self, content, lfs):
        sha1 = git_sha1(content)
        entry = {"size": len(content), "lfs": None}
        if lfs:
            sha256 = hashlib.sha256(content).hexdigest()
            self.blobs[sha256] = content
            entry["lfs"] = sha256
            entry["sha1"] = git_sha1(lfs_pointer(sha256, len(content)))
        else:
            self.blobs[sha1] = content
            entry["sha1"] = sha1
        return entry


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "LocalHub/1.0"

    def log_message(self, *args):
        pass

    # --- plumbing

    @property
    def state(self):
        return self.server.state

    def _body(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            return self.rfile.read(length)
        if self.headers.get("Transfer-Encoding") == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().strip(), 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return b""

    def _send(self, status, body=b"", headers=None, content_type=None):
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            content_type = content_type or "application/json"
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if content_type:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, error):
        headers = {"X-Error-Code": error.code, "X-Error-Message": error.message}
        if not error.code:
            headers.pop("X-Error-Code")
        self._send(error.status, {"error": error.message}, headers)

    def _user(self):
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            token = auth[len("Bearer ") :]
            if token not in self.state.tokens:
                raise HubError(
                    401, "", "Invalid credentials in Authorization header"
                )
            return self.state.tokens[token]
        return None

    def _repo(self, repo_id, write=False):
        user = self._user()
        repo = self.state.repos.get(repo_id)
        if repo is None or (repo.private and user is None):
            status = 401 if user is None else 404
            raise HubError(status, "RepoNotFound", "Repository not found")
        if write and user is None:
            raise HubError(401, "", "You must be authenticated to write")
        return repo

    def _dispatch(self):
        self.server.requests.append((self.command, self.path))
        parsed = urllib.parse.urlsplit(self.path)
        segments = [urllib.parse.unquote(s) for s in parsed.path.split("/")]
        segments = [s for s in segments[1:]]
        query = urllib.parse.parse_qs(parsed.query)
        try:
            with self.state.lock:
                self._route(segments, query)
        except HubError as error:
            self._error(error)

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _dispatch

    def _route(self, seg, query):
        method = self.command
        if seg[:2] == ["api", "whoami-v2"]:
            user = self._user()
            if user is None:
                raise HubError(401, "", "Invalid credentials")
            return self._send(200, {"type": "user", "name": user})
        if seg[:3] == ["api", "repos", "create"] and method == "POST":
            return self._create_repo(json.loads(self._body()))
        if seg[:2] == ["api", "validate-yaml"]:
            self._body()
            return self._send(200, {"errors": [], "warnings": []})
        if seg[:2] == ["api", "models"] and len(seg) >= 4:
            repo = self._repo(f"{seg[2]}/{seg[3]}", write=method == "POST")
            return self._api(repo, seg[4:], query)
        if len(seg) >= 3 and seg[1].endswith(".git"):
            repo_id = f"{seg[0]}/{seg[1][: -len('.git')]}"
            return self._lfs_batch(self._repo(repo_id, write=True))
        if seg[:1] == ["_lfs"] and method == "PUT":
            self.state.pending_lfs[seg[1]] = self._body()
            return self._send(200)
        if seg[:1] == ["_lfs_verify"] and method == "POST":
            return self._lfs_verify(json.loads(self._body()))
        if len(seg) >= 5 and seg[2] == "resolve":
            repo = self._repo(f"{seg[0]}/{seg[1]}")
            return self._resolve(repo, seg[3], "/".join(seg[4:]))
        raise HubError(404, "", f"Not found: {self.path}")

    # --- repositories

    def _create_repo(self, payload):
        user = self._user()
        if user is None:
            raise HubError(401, "", "You must be authenticated")
        repo_id = f"{payload.get('organization') or user}/{payload['name']}"
        if repo_id in self.state.repos:
            return self._send(
                409,
                {
                    "error": "You already created this repo",
                    "url": f"{self._root()}/{repo_id}",
                },
            )
        private = payload.get("private") or (
            payload.get("visibility") == "private"
        )
        repo = Repo(repo_id, bool(private), user)
        files = {".gitattributes": self.state.store(GITATTRIBUTES, False)}
        repo.branches["main"] = self.state.new_commit(
            repo, None, files, "initial commit"
        )
        self.state.repos[repo_id] = repo
        return self._send(200, {"url": f"{self._root()}/{repo_id}"})

    def _root(self):
        return f"http://{self.headers['Host']}"

    def _api(self, repo, seg, query):
        method = self.command
        if not seg and method == "GET":
            return self._info(repo, repo.branches["main"])
        kind, rest = seg[0], seg[1:]
        if kind == "revision" and method == "GET":
            return self._info(repo, repo.resolve(rest[0]))
        if kind == "tree" and method == "GET":
            return self._tree(repo, repo.resolve(rest[0]), "/".join(rest[1:]))
        if kind == "preupload" and method == "POST":
            return self._preupload(repo, rest[0], json.loads(self._body()))
        if kind == "commit" and method == "POST":
            return self._commit(repo, rest[0], query)
        if kind == "branch" and method == "POST":
            body = json.loads(self._body() or b"{}")
            if rest[0] in repo.branches:
                raise HubError(409, "", f"Branch {rest[0]} already exists")
            start = repo.resolve(body.get("startingPoint") or "main")
            repo.branches[rest[0]] = start
            return self._send(200, {})
        if kind == "tag" and method == "POST":
            body = json.loads(self._body())
            if body["tag"] in repo.tags:
                raise HubError(409, "", f"Tag {body['tag']} already exists")
            repo.tags[body["tag"]] = repo.resolve(rest[0])
            return self._send(200, {})
        if kind == "refs" and method == "GET":
            return self._send(200, self._refs(repo))
        if kind == "commits" and method == "GET":
            return self._commits(repo, repo.resolve(rest[0]))
        if kind == "paths-info" and method == "POST":
            return self._paths_info(repo, rest[0])
        raise HubError(404, "", f"Not found: {self.path}")

    def _info(self, repo, sha):
        files = repo.commits[sha]["files"]
        self._send(
            200,
            {
                "id": repo.repo_id,
                "_id": hashlib.md5(repo.repo_id.encode()).hexdigest()[:24],
                "modelId": repo.repo_id,
                "author": repo.repo_id.split("/")[0],
                "sha": sha,
                "private": repo.private,
                "disabled": False,
                "gated": False,
                "downloads": 0,
                "likes": 0,
                "tags": [],
                "lastModified": repo.commits[sha]["date"],
                "siblings": [{"rfilename": path} for path in sorted(files)],
            },
        )

    def _entry(self, path, entry):
        item = {
            "type": "file",
            "path": path,
            "size": entry["size"],
            "oid": entry["sha1"],
        }
        if entry["lfs"]:
            pointer = lfs_pointer(entry["lfs"], entry["size"])
            item["lfs"] = {
                "oid": entry["lfs"],
                "size": entry["size"],
                "pointerSize": len(pointer),
            }
        return item

    def _tree(self, repo, sha, prefix):
        files = repo.commits[sha]["files"]
        prefix = prefix.strip("/")
        items, folders = [], set()
        for path in sorted(files):
            if prefix and not path.startswith(prefix + "/"):
                continue
            relative = path[len(prefix) + 1 :] if prefix else path
            parts = relative.split("/")
            for i in range(1, len(parts)):
                folder = "/".join(([prefix] if prefix else []) + parts[:i])
                if folder not in folders:
                    folders.add(folder)
                    items.append(
                        {
                            "type": "directory",
                            "path": folder,
                            "size": 0,
                            "oid": hashlib.sha1(folder.encode()).hexdigest(),
                        }
                    )
            items.append(self._entry(path, files[path]))
        if prefix and not items:
            raise HubError(404, "EntryNotFound", f"{prefix} does not exist")
        self._send(200, items)

    def _paths_info(self, repo, revision):
        sha = repo.resolve(revision)
        body = self._body()
        ctype = self.headers.get("Content-Type", "")
        if "json" in ctype:
            paths = json.loads(body)["paths"]
        else:
            paths = urllib.parse.parse_qs(body.decode()).get("paths", [])
        files = repo.commits[sha]["files"]
        self._send(200, [self._entry(p, files[p]) for p in paths if p in files])

    def _refs(self, repo):
        def ref(kind, name, sha):
            return {
                "name": name,
                "ref": f"refs/{kind}/{name}",
                "targetCommit": sha,
            }

        return {
            "branches": [
                ref("heads", n, s)
                for n, s in repo.branches.items()
                if not n.startswith("refs/")
            ],
            "tags": [ref("tags", n, s) for n, s in repo.tags.items()],
            "converts": [],
            "pullRequests": [
                {"name": n[len("refs/pr/") :], "ref": n, "targetCommit": s}
                for n, s in repo.branches.items()
                if n.startswith("refs/pr/")
            ],
        }

    def _commits(self, repo, sha):
        history = []
        while sha is not None:
            commit = repo.commits[sha]
            history.append(
                {
                    "id": sha,
                    "title": commit["title"],
                    "message": "",
                    "authors": [{"user": repo.owner}],
                    "date": commit["date"],
                }
            )
            sha = commit["parent"]
        self._send(200, history)

    # --- uploads

    def _preupload(self, repo, revision, payload):
        files = repo.commits[repo.resolve(revision)]["files"]
        answers = []
        for item in payload["files"]:
            sample = base64.b64decode(item["sample"])
            lfs = (
                item["path"].endswith(LFS_SUFFIXES)
                or b"\0" in sample
                or item["size"] > 10 * 2**20
            )
            answer = {
                "path": item["path"],
                "uploadMode": "lfs" if lfs else "regular",
                "shouldIgnore": False,
            }
            existing = files.get(item["path"])
            if existing is not None:
                # The Hub answers the current oid so that the client can
                # drop unchanged files: sha256 for LFS, git sha1 otherwise.
                answer["oid"] = existing["lfs"] or existing["sha1"]
            answers.append(answer)
        self._send(200, {"files": answers, "commitOid": None})

    def _lfs_batch(self, repo):
        payload = json.loads(self._body())
        objects = []
        for obj in payload["objects"]:
            if obj["oid"] in self.state.blobs:
                objects.append({"oid": obj["oid"], "size": obj["size"]})
                continue
            objects.append(
                {
                    "oid": obj["oid"],
                    "size": obj["size"],
                    "authenticated": True,
                    "actions": {
                        "upload": {"href": f"{self._root()}/_lfs/{obj['oid']}"},
                        "verify": {
                            "href": f"{self._root()}/_lfs_verify/{obj['oid']}"
                        },
                    },
                }
            )
        self._send(
            200,
            {"transfer": "basic", "objects": objects},
            content_type="application/vnd.git-lfs+json",
        )

    def _lfs_verify(self, payload):
        content = self.state.pending_lfs.pop(payload["oid"], None)
        if (
            content is None
            or hashlib.sha256(content).hexdigest() != payload["oid"]
            or len(content) != payload["size"]
        ):
            raise HubError(422, "", f"LFS object {payload['oid']} is invalid")
        self.state.blobs[payload["oid"]] = content
        self._send(200, {"success": True})

    def _commit(self, repo, revision, query):
        lines = [
            json.loads(line)
            for line in self._body().splitlines()
            if line.strip()
        ]
        header = next(x["value"] for x in lines if x["key"] == "header")
        create_pr = query.get("create_pr", ["0"])[0] in ("1", "true")
        if create_pr:
            parent = repo.resolve(revision)
        else:
            if revision not in repo.branches:
                raise HubError(
                    404, "RevisionNotFound", f"Invalid rev id: {revision}"
                )
            parent = repo.branches[revision]
        expected = header.get("parentCommit")
        if expected and expected != parent:
            raise HubError(
                412, "", f"parentCommit {expected} is not the head {parent}"
            )
        files = dict(repo.commits[parent]["files"])
        for line in lines:
            key, value = line["key"], line["value"]
            if key == "file":
                content = base64.b64decode(value["content"])
                files[value["path"]] = self.state.store(content, False)
            elif key == "lfsFile":
                content = self.state.blobs.get(value["oid"])
                if content is None:
                    raise HubError(
                        400, "", f"LFS object {value['oid']} was not uploaded"
                    )
                files[value["path"]] = self.state.store(content, True)
            elif key == "deletedFile":
                if files.pop(value["path"], None) is None:
                    raise HubError(
                        404,
                        "EntryNotFound",
                        f"A file with this name doesn't exist: {value['path']}",
                    )
            elif key == "deletedFolder":
                prefix = value["path"].rstrip("/") + "/"
                for path in [p for p in files if p.startswith(prefix)]:
                    del files[path]
        sha = self.state.new_commit(repo, parent, files, header["summary"])
        result = {
            "commitOid": sha,
            "commitUrl": f"{self._root()}/{repo.repo_id}/commit/{sha}",
        }
        if create_pr:
            repo.pull_requests += 1
            number = repo.pull_requests
            repo.branches[f"refs/pr/{number}"] = sha
            result["pullRequestUrl"] = (
                f"{self._root()}/{repo.repo_id}/discussions/{number}"
            )
        else:
            repo.branches[revision] = sha
        self._send(200, result)

    # --- downloads

    def _resolve(self, repo, revision, path):
        sha = repo.resolve(revision)
        entry = repo.commits[sha]["files"].get(path)
        if entry is None:
            raise HubError(
                404, "EntryNotFound", f"{path} does not exist at {revision}"
            )
        content = self.state.blobs[entry["lfs"] or entry["sha1"]]
        headers = {"X-Repo-Commit": sha, "ETag": f'"{entry["sha1"]}"'}
        if entry["lfs"]:
            headers["ETag"] = f'"{entry["lfs"]}"'
            headers["X-Linked-Etag"] = f'"{entry["lfs"]}"'
            headers["X-Linked-Size"] = str(entry["size"])
        status = 200
        range_header = self.headers.get("Range")
        if range_header and range_header.startswith("bytes="):
            start = int(range_header[len("bytes=") :].split("-")[0] or 0)
            headers["Content-Range"] = (
                f"bytes {start}-{len(content) - 1}/{len(content)}"
            )
            content = content[start:]
            status = 206
        self._send(status, content, headers, "application/octet-stream")


class HubServer(http.server.ThreadingHTTPServer):
    """The local Hub on 127.0.0.1:`port`, served from a daemon thread."""

    daemon_threads = True

    def __init__(self, port, tokens=None):
        super().__init__(("127.0.0.1", port), Handler)
        self.state = HubState(tokens or {})
        self.requests = []
        self.thread = None

    def start(self):
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()
        return self

    def stop(self):
        self.shutdown()
        self.server_close()
