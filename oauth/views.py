"""The consent page: where a signed-in user approves a client and picks the agent it acts as.

The toolkit's authorization view does the protocol (client and redirect URI
checks, PKCE, the code); this one adds what Recall needs: the client's name
and where it came from, a choice among the user's agents (or a new one),
and the refusal of any ``resource`` that is not one of Recall's endpoints.
Signing in is the dashboard's own sign-in page.
"""

from __future__ import annotations

import uuid
from typing import Any

from django import forms
from django.http import HttpRequest, HttpResponse
from oauth2_provider.exceptions import OAuthToolkitError
from oauth2_provider.forms import AllowForm
from oauth2_provider.views import AuthorizationView
from oauthlib.oauth2.rfc6749.errors import CustomOAuth2Error, InvalidRequestError

from accounts import services as accounts_services
from accounts.models import Agent
from core.errors import NotFound, RecallError
from oauth import resources
from oauth.services import describe_client, find_application

NEW_AGENT = "new"


class ConsentForm(AllowForm):
    agent = forms.CharField(required=False)
    new_agent = forms.CharField(required=False, max_length=accounts_services.AGENT_NAME_MAX)


class ConsentView(AuthorizationView):
    template_name = "oauth/consent.html"
    form_class = ConsentForm

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        unknown = [uri for uri in request.GET.getlist("resource") if not resources.is_known(uri)]
        if unknown:
            return self._refuse_resource(unknown[0], request.GET.get("redirect_uri"))
        return super().get(request, *args, **kwargs)

    def validate_authorization_request(self, request: HttpRequest) -> tuple[Any, dict[str, Any]]:
        scopes, credentials = super().validate_authorization_request(request)
        # The toolkit refuses a "plain" challenge only when it issues the code,
        # after the user has approved; send the client back before asking.
        # (Without a method, RFC 7636 says the challenge is plain.)
        if credentials.get("code_challenge_method") != "S256":
            refused = InvalidRequestError(
                description='PKCE with code_challenge_method "S256" is required.',
                state=credentials.get("state"),
            )
            # Checked against the client's registration or metadata document above.
            refused.redirect_uri = credentials.get("redirect_uri")
            raise OAuthToolkitError(error=refused)
        return scopes, credentials

    def form_valid(self, form: ConsentForm) -> HttpResponse:
        resource = form.cleaned_data.get("resource") or ""
        unknown = [uri for uri in resource.split() if not resources.is_known(uri)]
        if unknown:
            return self._refuse_resource(unknown[0], form.cleaned_data.get("redirect_uri"))
        self.agent: Agent | None = None
        if form.cleaned_data.get("allow"):
            try:
                self.agent = self._chosen_agent(form)
            except RecallError as exc:
                form.add_error(None, exc.message)
                return self.form_invalid(form)
        return super().form_valid(form)

    def create_authorization_response(
        self, request: HttpRequest, scopes: str, credentials: dict[str, Any], allow: bool
    ) -> Any:
        agent = getattr(self, "agent", None)
        if allow and agent is not None:
            # oauthlib sets credentials on its request; the validator stores the
            # agent on the code, and from there on every token.
            credentials = {**credentials, "agent_id": agent.id}
        return super().create_authorization_response(request, scopes, credentials, allow)

    def _chosen_agent(self, form: ConsentForm) -> Agent:
        user_id = self.request.user.pk
        choice = form.cleaned_data.get("agent") or ""
        if choice == NEW_AGENT:
            return accounts_services.create_agent(
                user_id=user_id, name=form.cleaned_data.get("new_agent")
            )
        try:
            agent_id = uuid.UUID(choice)
        except ValueError:
            raise NotFound("Choose the agent this connection acts as.") from None
        return accounts_services.get_agent(user_id=user_id, agent_id=agent_id)

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        client_id = kwargs.get("client_id") or self._posted("client_id")
        application = kwargs.get("application") or (
            find_application(client_id=client_id) if client_id else None
        )
        if application is not None:
            name, origin, how = describe_client(application)
            context.update(
                application=application,
                client_name=name,
                client_origin=origin,
                registration=how,
                redirect_host=_host(kwargs.get("redirect_uri") or self._posted("redirect_uri")),
            )
        agents = accounts_services.list_agents(user_id=self.request.user.pk)
        form = context.get("form")
        chosen = form["agent"].value() if form is not None else None
        context.update(
            agents=agents,
            chosen_agent=chosen or (str(agents[0].id) if agents else NEW_AGENT),
            new_agent=NEW_AGENT,
            resource_names=[
                path
                for path in resources.PATHS
                if resources.identifier(path)
                in (kwargs.get("resource") or self._posted("resource") or "").split()
            ],
        )
        return context

    def _posted(self, name: str) -> str:
        return self.request.POST.get(name, "") if self.request.method == "POST" else ""

    def _refuse_resource(self, uri: str, redirect_uri: str | None) -> HttpResponse:
        error = OAuthToolkitError(
            error=CustomOAuth2Error(
                error="invalid_target",
                description=(
                    f"This server issues tokens only for {', '.join(resources.identifiers())}."
                ),
                state=self.request.GET.get("state") or self.request.POST.get("state"),
            ),
        )
        # Never redirect to an unchecked URI: show the error here.
        return self.render_to_response({"error": error.oauthlib_error}, status=400)


def _host(uri: str) -> str:
    from urllib.parse import urlsplit

    return urlsplit(uri).netloc if uri else ""
