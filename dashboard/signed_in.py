"""The request a dashboard view gets once ``login_required`` has let it through."""

from __future__ import annotations

from django.http import HttpRequest

from accounts.models import User


class AuthenticatedRequest(HttpRequest):
    """A request ``login_required`` let through: its user is signed in, never anonymous."""

    user: User
