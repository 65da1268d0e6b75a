"""The ``server`` section: where the app listens, who may sign in, and what the web stack trusts."""
from __future__ import annotations

from dataclasses import dataclass

from rlhf.config.fields import Checked, opt


@dataclass
class ServerConfig(Checked):
    host: str = opt("127.0.0.1", "Interface the app listens on.")
    port: int = opt(7860, "Port the app listens on.")
    users: str = opt("", "Users as 'name:password:role,...' (empty = single-user local mode).")
    users_file: str = opt("", "YAML/JSON file of users {name, password|password_hash, role}.")
    admins: list = opt([], "Hugging Face user names that are admins on Spaces.")
    rate_limit_per_minute: int = opt(120, "Requests a user may make per minute (0 = unlimited).")
    timer_rate_limit_per_minute: int = opt(600, "UI timer ticks (and the events they chain) a user's open pages may "
                                           "make per minute, a budget apart from rate_limit_per_minute (0 = unlimited).")
    max_body_bytes: int = opt(1_000_000, "Largest accepted request body.")
    max_file_size: str = opt("5mb", "Largest file a browser may upload to the UI.")
    space_id: str = opt("", "Hugging Face Space id; set from SPACE_ID on Spaces (turns on HF sign-in; the Spaces "
                        "defaults apply only on a real Space, SYSTEM=spaces).")
    insecure_hf_sign_in_off_space: bool = opt(False, "Let HF sign-in (space_id set) start outside a real Space, where "
                                              "Gradio signs every visitor in as this machine's HF user: only to try "
                                              "the sign-in page on your own machine; refused with server.admins.")
    persistent_dir: str = opt("/data", "Spaces persistent storage mount; the data dir when it exists on a Space.")
    hf_token: str = opt("", "Hugging Face token for `export --push-to-hub` and `push-policy` (also read from HF_TOKEN).")
    hf_endpoint: str = opt("", "Hugging Face Hub URL for `push-policy` (empty = huggingface.co; also read from "
                           "HF_ENDPOINT).")
    allowed_origins: list = opt([], "Other origins (scheme://host[:port]) that may call the app from a browser; default same-origin only.")
    allowed_hosts: list = opt([], "Host names the app answers to besides localhost, server.host and a Space's own host; '*' = any.")
    login_max_failures: int = opt(10, "Failed sign-ins per client address (any name, and so per name from that address) "
                                  "before every attempt from it gets 429 (0 = off); others elsewhere are not locked out.")
    login_window_seconds: float = opt(600.0, "Window over which failed sign-ins are counted; a lock-out lifts as old failures leave it.")
    login_name_failures: int = opt(20, "Failed sign-ins for one name from any addresses before each further attempt "
                                   "for it waits 1, 2, 4, ... s (0 = off); an address it signed in from before is "
                                   "not held back.")
    login_max_backoff_seconds: float = opt(60.0, "Longest wait between attempts for one name (the owner is never "
                                           "locked out for longer).")
    trusted_proxies: list = opt([], "Addresses or networks (CIDR) of reverse proxies whose X-Forwarded-For/-Proto/-Host "
                                "are believed; empty = none (the default; a Space trusts its own proxy). '*' = any peer.")
    max_replies_per_user: int = opt(4, "Replies one signed-in user may have generating at once (an arena round is "
                                    "two); more get 429 (0 = no cap; local mode is one person: no cap).")
    shutdown_seconds: float = opt(5.0, "On SIGTERM/SIGINT, replies still generating are cancelled (not stored) and "
                                  "requests still open after this many seconds are dropped.")
    leaderboard_refit_seconds: float = opt(5.0, "Least time between two background refits of an agent's leaderboard; "
                                           "readers get the last table at once meanwhile.")
    open_feedback: bool = opt(False, "Let annotators see everyone's ratings, flags and notes (default: their own; admins see all).")

    @property
    def local_mode(self) -> bool:
        """Single-user local mode: no configured users and no Hugging Face sign-in (everyone is the one admin)."""
        return not (self.users.strip() or self.users_file.strip() or self.space_id.strip())

    @property
    def hf_sign_in(self) -> bool:
        """Hugging Face sign-in: a Space id and no configured users (anyone with an HF account signs in)."""
        return bool(self.space_id.strip()) and not (self.users.strip() or self.users_file.strip())
