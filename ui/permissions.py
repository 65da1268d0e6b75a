"""Who may do what. Without configured users the app runs in single-user local mode: everyone is admin."""
from __future__ import annotations

from typing import Optional

from ui.services import Services


class Forbidden(PermissionError):
    """The signed-in user's role may not perform this action."""


def current_user(services: Services, request=None) -> Optional[str]:
    """The signed-in user name (Gradio request or REST), or None in local mode."""
    if services.auth is None or request is None:
        return None
    return services.auth.user_of(request)


def is_admin(services: Services, request=None) -> bool:
    """True in local mode, else when the signed-in user has the admin role."""
    if services.auth is None:
        return True
    return services.auth.role_of(request) == "admin"


def require_admin(services: Services, request=None) -> None:
    """Raise Forbidden unless the caller may perform admin actions."""
    if not is_admin(services, request):
        raise Forbidden("this action needs the admin role")


def sees_all_feedback(services: Services, request=None) -> bool:
    """True when the caller may read every annotator's ratings, flags and notes: admins, local mode, or
    everyone with ``server.open_feedback``; otherwise a caller sees only their own."""
    return bool(services.config.server.open_feedback) or is_admin(services, request)
