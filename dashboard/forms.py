from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django import forms
from django.contrib.auth import forms as auth_forms

from accounts import services as accounts_services
from accounts import tiers
from accounts.models import Agent, User


class KeyForm(forms.Form):
    name = forms.CharField(
        max_length=100,
        required=False,
        widget=forms.TextInput(attrs={"placeholder": "e.g. laptop, CI, research agent"}),
    )
    tier = forms.ChoiceField()
    # Empty: a user-wide key. An agent's id: the key acts as that agent.
    agent = forms.ChoiceField(required=False)
    # A fresh token on every page: a form sent again (a reload of the page
    # that showed the new key) names a spent one and creates nothing.
    once = forms.CharField(required=False, max_length=64, widget=forms.HiddenInput)

    def __init__(
        self, *args: Any, max_tier: str, agents: Iterable[Agent] = (), **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        agent = self.fields["agent"]
        assert isinstance(agent, forms.ChoiceField)  # declared above
        agent.choices = [("", "All memories (no agent)")] + [
            (str(a.id), f"Agent: {a.name}") for a in agents
        ]
        # Only tiers up to the user's own: the service refuses anything above.
        allowed = [t for t in tiers.ORDER if tiers.rank(t) <= tiers.rank(max_tier)]
        tier = self.fields["tier"]
        assert isinstance(tier, forms.ChoiceField)  # declared above
        tier.choices = [(t.value, t.label) for t in allowed]
        tier.initial = max_tier


class SignupForm(auth_forms.BaseUserCreationForm):
    class Meta:
        model = User
        fields = ("email",)

    def clean_email(self) -> str:
        email = accounts_services.normalize_email(self.cleaned_data.get("email"))
        if accounts_services.find_user(email=email) is not None:
            raise forms.ValidationError("An account with this email already exists.")
        return email


IMPORT_FORMATS = [
    ("mem0", "mem0: get_all or export JSON (.json, .jsonl)"),
    ("openmemory", "OpenMemory: export archive (.zip)"),
    ("mcp-memory-service", "mcp-memory-service: SQLite-vec database (.db)"),
    ("basic-memory", "basic-memory: the notes folder, zipped (.zip), or one note (.md)"),
    ("letta", "Letta: agent file (.af) or archival passages (.json)"),
    ("jsonl", "JSON Lines, with a field mapping"),
    ("csv", "CSV, with a column mapping"),
]


class ImportForm(forms.Form):
    """An upload to import, and how (the same options as `recall import --from`)."""

    format = forms.ChoiceField(choices=IMPORT_FORMATS)
    file = forms.FileField()
    namespace = forms.CharField(max_length=64, required=False, initial="default")
    columns = forms.CharField(
        max_length=1000,
        required=False,
        label="Field mapping (JSON Lines, CSV)",
        widget=forms.TextInput(attrs={"placeholder": "content=text,created_at=date"}),
    )
    ids = forms.CharField(
        max_length=200,
        required=False,
        label="Identities (mem0, OpenMemory, Letta)",
        widget=forms.TextInput(attrs={"placeholder": "user_id=metadata,run_id=namespace"}),
    )
    dry_run = forms.BooleanField(required=False, label="Dry run: check, store nothing")
