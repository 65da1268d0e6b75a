"""Private downloads: files made for one admin in the UI (exports), served to admins only, deleted soon.

A download lives in its own directory (mode 0700, files 0600) inside Gradio's upload folder, so Gradio
serves it in place instead of copying it into its cache; the upload folder itself is made owner-only at start
(``seal_upload_folder``), so other local users cannot list it. ``AdminOnlyFiles`` sits inside the Gradio app, where
the sign-in cookie and the HF session are readable: a request that names such a file on any of Gradio's file routes
(``/gradio_api/file=<path>``, ``/gradio_api/file/<path>``), or names a download directory anywhere in its path,
gets 403 unless an admin asks. The directory is deleted after the first complete download, or ``ttl`` seconds
after it was made, whichever comes first (and at exit).
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Optional, TypeVar
from urllib.parse import unquote

T = TypeVar("T")
FILE_ROUTES = ("/gradio_api/file=", "/gradio_api/file/")  # every route Gradio serves a file by its path at
UPLOAD_ROUTE = "/gradio_api/upload"  # Gradio's file upload: no component of this UI takes a file
TTL = 300.0  # seconds an undownloaded export stays on disk


def upload_folder() -> Path:
    """Gradio's upload folder (GRADIO_TEMP_DIR): files inside it are served without a copy."""
    from gradio.utils import get_upload_folder

    return Path(get_upload_folder())


def seal_upload_folder() -> Path:
    """Make Gradio's upload folder owner-only (0700), creating it if needed: its files (uploads, cached outputs,
    private downloads) are then out of other local users' reach. Warns when another user owns it."""
    import logging

    folder = upload_folder()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        os.chmod(folder, 0o700)
    except PermissionError:
        logging.getLogger(__name__).warning("Gradio's upload folder %s belongs to another user and stays readable "
                                            "to others: set GRADIO_TEMP_DIR to a folder of your own", folder)
    return folder


def requested_file(path: str) -> Optional[str]:
    """The file path a request names on one of Gradio's file routes (``FILE_ROUTES``), or None."""
    hits = [(path.find(route), route) for route in FILE_ROUTES if route in path]
    if not hits:
        return None
    at, route = min(hits)
    return unquote(path[at + len(route):])


class PrivateDownloads:
    """Directories of files offered once to an admin; each removed after its download or ``ttl``."""

    def __init__(self, ttl: float = TTL, root: Optional[Path] = None):
        self.ttl = ttl
        self.root = root
        self._dirs: dict[Path, float] = {}  # directory -> deadline (monotonic)
        self._lock = threading.Lock()
        atexit.register(self.clear)

    def new_dir(self, prefix: str = "rlhf-export-") -> Path:
        """A fresh private directory (0700) for one download; it is deleted within ``ttl`` seconds."""
        root = self.root or upload_folder()
        root.mkdir(parents=True, exist_ok=True)
        path = Path(tempfile.mkdtemp(prefix=prefix, dir=root)).resolve()  # mkdtemp makes it 0700
        with self._lock:
            self._dirs[path] = time.monotonic() + self.ttl
        timer = threading.Timer(self.ttl, self.remove, [path])
        timer.daemon = True
        timer.start()
        return path

    def offer(self, write: Callable[[Path], T], prefix: str = "rlhf-export-") -> T:
        """``write(folder)`` into a fresh private directory, then seal it; what ``write`` returns (the file to offer).
        A write that fails leaves nothing behind."""
        work = self.new_dir(prefix)
        try:
            result = write(work)
            self.seal(work)
        except BaseException:
            self.remove(work)
            raise
        return result

    def seal(self, folder: Path) -> None:
        """Make a download's directory and everything in it owner-only (0700 directories, 0600 files)."""
        for path in [Path(folder), *Path(folder).rglob("*")]:
            os.chmod(path, 0o700 if path.is_dir() else 0o600)

    def owner_dir(self, file: str | Path) -> Optional[Path]:
        """The download directory a path lies in, or None for any other file."""
        try:
            resolved = Path(file).resolve()
        except (OSError, ValueError):
            return None
        with self._lock:
            return next((d for d in self._dirs if resolved == d or d in resolved.parents), None)

    def named_in(self, path: str) -> Optional[Path]:
        """The download directory whose (random) name appears in a request path, or None: a route that serves files
        by path must name it, whatever the route."""
        with self._lock:
            return next((d for d in self._dirs if d.name in path), None)

    def remove(self, path: Path) -> None:
        """Delete a download's directory now."""
        with self._lock:
            self._dirs.pop(path, None)
        shutil.rmtree(path, ignore_errors=True)

    def clear(self) -> None:
        """Delete every download still on disk."""
        with self._lock:
            paths = list(self._dirs)
        for path in paths:
            self.remove(path)




class AdminOnlyFiles:
    """Pure ASGI middleware (innermost in the Gradio app) guarding private downloads on every route that could
    serve them: non-admins get 403; a complete download deletes the directory."""

    def __init__(self, app, may_download: Callable, downloads: PrivateDownloads):
        self.app = app
        self.may_download = may_download  # Starlette request -> bool
        self.downloads = downloads

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "") if scope["type"] == "http" else ""
        named = requested_file(path)
        folder = (self.downloads.owner_dir(named) if named is not None else None) or \
            self.downloads.named_in(unquote(path))
        if folder is None:
            return await self.app(scope, receive, send)
        from starlette.requests import Request
        from starlette.responses import JSONResponse

        # Who asks is told by the sign-in cookie or the HF session; a password header here would be a guess
        # that skips the sign-in throttle, so it is not looked at.
        viewer = {**scope, "headers": [(k, v) for k, v in scope["headers"] if k.lower() != b"authorization"]}
        if not self.may_download(Request(viewer, receive)):
            return await JSONResponse({"error": "exports are for admins"}, status_code=403)(scope, receive, send)
        seen = {"status": None, "length": None, "sent": 0, "last": False}

        async def sending(message):
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
                length = dict(message.get("headers", [])).get(b"content-length", b"")
                seen["length"] = int(length) if length.isdigit() else None
            await send(message)
            if message["type"] == "http.response.body":
                seen["sent"] += len(message.get("body", b""))
                seen["last"] = not message.get("more_body", False)

        await self.app(scope, receive, sending)
        complete = seen["last"] or (seen["length"] is not None and seen["sent"] >= seen["length"])
        if scope["method"] == "GET" and seen["status"] == 200 and complete:
            self.downloads.remove(folder)


class NoUploads:
    """Pure ASGI middleware (in the Gradio app): ``/gradio_api/upload`` answers 403 before a byte of the body is
    read. Nothing in the UI uploads a file, so the route would only let anyone fill the disk (issue 41)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and unquote(scope.get("path", "")).rstrip("/").endswith(UPLOAD_ROUTE):
            from starlette.responses import JSONResponse

            return await JSONResponse({"error": "this app takes no file uploads"}, status_code=403)(
                scope, receive, send)
        return await self.app(scope, receive, send)
