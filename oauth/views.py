"""The consent page: where a signed-in user approves a client and picks the agent it acts as.

The toolkit's authorization view does the protocol (client and redirect URI
checks, PKCE, the code); this one adds what Recall needs:

* the request is checked before anyone is asked to sign in: an unknown
  client, a redirect URI the client did not register, a missing or plain
  PKCE challenge and a resource that is not one of Recall's endpoints each
  get an error page, never the password form and never a redirect to an
  address the client did not register;
* a request that names no ``resource`` (clients older than protocol
  2025-06-18) is bound to ``/mcp``, the endpoint the root protected-resource
  metadata describes, so the token it leads to works somewhere;
* the page names the signed-in account (with a way to switch), says what it
  knows of the client and how far to trust it, and offers the user's agents
  or a new one named after the client, chosen so that Allow alone works.

Signing in is the dashboard's own sign-in page.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any
from urllib.parse import parse_qs, parse_qsl, urlencode, urlsplit, urlunsplit

from django import forms
from django.conf import settings
from django.contrib.auth.views import LoginView
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.cache import patch_cache_control
from oauth2_provider.cimd import is_cimd_client_id
from oauth2_provider.exceptions import FatalClientError, OAuthToolkitError
from oauth2_provider.forms import AllowForm
from oauth2_provider.settings import oauth2_settings
from oauth2_provider.views import AuthorizationView, RevokeTokenView, TokenView
from oauthlib.oauth2.rfc6749 import errors

from accounts import services as accounts_services
from accounts.models import Agent
from core import csp
from core.errors import NotFound, RecallError
from oauth import resources
from oauth import services as oauth_services
from oauth.models import Application

NEW_AGENT = "new"
# The oauth2 fields the consent form carries, in the order a request names them.
REQUEST_FIELDS = (
    "response_type",
    "client_id",
    "redirect_uri",
    "scope",
    "state",
    "code_challenge",
    "code_challenge_method",
    "resource",
)


class PlainChallenge(errors.InvalidRequestError):
    description = 'PKCE with code_challenge_method "S256" is required.'


class MalformedChallenge(errors.InvalidRequestError):
    description = (
        "code_challenge must be an S256 challenge: 43 characters of base64url "
        "(letters, digits, - and _), as RFC 7636 section 4.2 makes it."
    )


# What BASE64URL(SHA256(verifier)) always is. Anything else can match no verifier,
# and one that is not ASCII made the token endpoint's comparison raise (a 500).
S256_CHALLENGE = re.compile(r"[A-Za-z0-9_-]{43}")


class ConsentForm(AllowForm):
    agent = forms.CharField(required=False)
    new_agent = forms.CharField(required=False, max_length=accounts_services.AGENT_NAME_MAX)


class ConsentView(AuthorizationView):
    template_name = "oauth/consent.html"
    form_class = ConsentForm
    # The agent the code acts as: chosen on the page, or without it (get()).
    agent: Agent | None = None

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if request.method == "GET":
            refused = self._refusal(request)
            if refused is not None:
                return refused
            if not request.GET.getlist("resource"):
                # The toolkit reads the resource from the query; give it the default.
                query = request.GET.copy()
                query.setlist("resource", [resources.identifier(resources.MCP_PATH)])
                request.GET = query  # type: ignore[assignment]  # a copy is mutable
        return super().dispatch(request, *args, **kwargs)

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        # The toolkit answers two requests without showing the page: one from
        # a client the operator trusts (skip_authorization), and one asking
        # approval_prompt=auto of a user who holds a live token for the
        # client. Their codes must act as an agent too, or no endpoint takes
        # the token they lead to. A trusted client's is chosen only once the
        # code is issued (create_authorization_response), never for a request
        # the toolkit sends elsewhere first (prompt=login).
        application = self._application(request.GET.get("client_id"))
        auto = request.GET.get("approval_prompt") == "auto"
        if application is not None and not application.skip_authorization and auto:
            connected = oauth_services.connected_agents(
                user_id=self.request.user.pk,  # signed in: the toolkit's dispatch saw to it
                application=application,
                # dispatch() gave a request without one the default resource.
                resources=request.GET.getlist("resource"),
            )
            if len(connected) == 1:
                self.agent = connected[0]
            else:
                # No connection to go on with (none for this endpoint), or
                # several to choose from: ask.
                query = request.GET.copy()
                query["approval_prompt"] = "force"
                request.GET = query  # type: ignore[assignment]  # a copy is mutable
        return super().get(request, *args, **kwargs)

    def _refusal(self, request: HttpRequest) -> HttpResponse | None:
        """Return the error page for a request that cannot succeed, whoever signs in."""
        try:
            _, credentials = self.validate_authorization_request(request)
        except OAuthToolkitError as error:
            return self._error_page(error.oauthlib_error, fatal=isinstance(error, FatalClientError))
        named = request.GET.getlist("resource")
        unknown = [uri for uri in named if not resources.is_known(uri)]
        if unknown or len(named) > 1:
            refused = errors.CustomOAuth2Error(
                error="invalid_target",
                description=(
                    f"This server issues tokens only for {', '.join(resources.identifiers())}."
                    if unknown
                    else "Name one resource: a token is for one MCP endpoint."
                ),
                state=credentials.get("state"),
            )
            unknown = unknown or named[1:]
            refused.redirect_uri = credentials.get("redirect_uri")
            return self._error_page(refused, fatal=False, resource=unknown[0])
        return None

    def validate_authorization_request(self, request: HttpRequest) -> tuple[Any, dict[str, Any]]:
        scopes, credentials = super().validate_authorization_request(request)
        # The toolkit refuses a "plain" challenge only when it issues the code,
        # after the user has approved; refuse it before asking. (Without a
        # method, RFC 7636 says the challenge is plain.)
        refused: errors.InvalidRequestError | None = None
        if credentials.get("code_challenge_method") != "S256":
            refused = PlainChallenge(state=credentials.get("state"))
        elif not S256_CHALLENGE.fullmatch(str(credentials.get("code_challenge") or "")):
            refused = MalformedChallenge(state=credentials.get("state"))
        if refused is not None:
            # Checked against the client's registration or metadata document above.
            refused.redirect_uri = credentials.get("redirect_uri")
            raise OAuthToolkitError(error=refused)
        return scopes, credentials

    def _error_page(self, error: Any, *, fatal: bool, resource: str = "") -> HttpResponse:
        """Explain a refused request; offer to take the error back to the client if we may.

        A fatal error (unknown client, unregistered redirect URI) has no address
        we may send the browser to. Any other came from a request whose
        redirect URI the client registered, so the page links there with the
        error, as the client expects to receive it (RFC 6749 section 4.1.2.1).
        """
        client_id = self.request.GET.get("client_id") or self.request.POST.get("client_id") or ""
        reason = _reason(error, client_id)
        back = ""
        if not fatal and error.redirect_uri:
            params = [*error.twotuples, ("iss", settings.RECALL_PUBLIC_URL)]
            back = error.redirect_uri + ("&" if "?" in error.redirect_uri else "?")
            back += urlencode(params)
        return self.render_to_response(
            {
                "error": error,
                "reason": reason,
                "resource": resource,
                "endpoints": resources.identifiers(),
                "back_url": back,
                "back_host": _host(error.redirect_uri or "") if back else "",
                "client_host": _hostname(client_id),
            },
            status=400,
        )

    def form_valid(self, form: ConsentForm) -> HttpResponse:
        # The form carries the request back; what was checked on the way in is
        # checked again (a challenge sent only here was stored, or failed to be).
        challenge = str(form.cleaned_data.get("code_challenge") or "")
        if form.cleaned_data.get("code_challenge_method") != "S256":
            return self._error_page(
                PlainChallenge(state=form.cleaned_data.get("state")), fatal=True
            )
        if not S256_CHALLENGE.fullmatch(challenge):
            refused = MalformedChallenge(state=form.cleaned_data.get("state"))
            return self._error_page(refused, fatal=True)
        resource = form.cleaned_data.get("resource") or ""
        unknown = [uri for uri in resource.split() if not resources.is_known(uri)]
        if unknown or not resource:
            refused = errors.CustomOAuth2Error(
                error="invalid_target",
                description=(
                    f"This server issues tokens only for {', '.join(resources.identifiers())}."
                ),
                state=form.cleaned_data.get("state"),
            )
            # Never redirect to an unchecked URI: show the error here.
            return self._error_page(refused, fatal=True, resource=unknown[0] if unknown else "")
        self.agent = None
        if form.cleaned_data.get("allow"):
            try:
                self.agent = self._chosen_agent(form)
            except RecallError as exc:
                form.add_error(None, exc.message)
                return self.form_invalid(form)
        response = super().form_valid(form)
        created = self.agent is not None and form.cleaned_data.get("agent") == NEW_AGENT
        if created and not _granted(response):
            # The toolkit refused the request after the agent was made for it
            # (a redirect URI the client never registered, on a page; a bad
            # scope, as a redirect with an error): no connection stands for
            # it, so neither does the agent.
            assert self.agent is not None
            accounts_services.delete_agent(user_id=self.request.user.pk, agent_id=self.agent.id)
        return response

    def create_authorization_response(
        self, request: HttpRequest, scopes: str, credentials: dict[str, Any], allow: bool
    ) -> Any:
        made = False
        if allow and self.agent is None and self.request.method != "POST":
            # Without the page (GET, or HEAD, which Django answers with get()):
            # a trusted client's request.
            self.agent, made = self._trusted_client_agent(credentials)
        if allow and self.agent is not None:
            # oauthlib sets credentials on its request; the validator stores the
            # agent on the code, and from there on every token.
            credentials = {**credentials, "agent_id": self.agent.id}
        try:
            response = super().create_authorization_response(request, scopes, credentials, allow)
        except OAuthToolkitError:
            self._unmake(made)
            raise
        uri = response[0]  # (uri, headers, body, status)
        if _refused_at(uri):
            # Refused with an error sent to the client (a redirect, not an
            # exception): no code acts as the agent made for it.
            self._unmake(made)
        elif allow:
            oauth_services.mark_approved(client_id=credentials["client_id"])
        return response

    def handle_no_permission(self) -> HttpResponse:
        # prompt=none from someone not signed in: the toolkit sends the client
        # login_required without naming the issuer, as RFC 9207 asks of every
        # authorization response, errors included.
        response: HttpResponse = super().handle_no_permission()
        return self._named(response)

    def _named(self, response: HttpResponse) -> HttpResponse:
        """``response``, an error sent back to the client, naming the issuer (RFC 9207)."""
        location = response.get("Location") if response.status_code in (301, 302, 303) else None
        if (
            location
            and _refused_at(location)
            and oauth2_settings.COMPLIANT_BCP_RFC9700_AUTHZ_RESPONSE_ISS
        ):
            issuer = oauth2_settings.oauth2_authorization_server_issuer(self.request)
            response["Location"] = _with_issuer(location, issuer)
        return response

    def error_response(self, error: Any, application: Any, **kwargs: Any) -> HttpResponse:
        # The toolkit names the issuer (RFC 9207) on the codes oauthlib issues
        # and on the errors it returns, but not on a refusal raised on the way
        # (a trusted client's agent that could not be made): a client that
        # checks for the mix-up attack would discard that error.
        response: HttpResponse = super().error_response(error, application, **kwargs)
        return self._named(response)

    def _unmake(self, made: bool) -> None:
        """Delete the agent made for a code that was never issued."""
        if made and self.agent is not None:
            accounts_services.delete_agent(user_id=self.request.user.pk, agent_id=self.agent.id)

    def _trusted_client_agent(self, credentials: dict[str, Any]) -> tuple[Agent | None, bool]:
        """The agent a trusted client's code acts as, and whether it was made for it."""
        application = self._application(credentials.get("client_id"))
        if application is None or not application.skip_authorization:
            return None, False
        try:
            return oauth_services.trusted_client_agent(
                user_id=self.request.user.pk, application=application
            )
        except RecallError as exc:
            state = credentials.get("state")
            refused = errors.AccessDeniedError(description=exc.message, state=state)
            redirect_uri = credentials.get("redirect_uri")
            raise OAuthToolkitError(error=refused, redirect_uri=redirect_uri) from None

    def _chosen_agent(self, form: ConsentForm) -> Agent:
        user_id = self.request.user.pk
        choice = form.cleaned_data.get("agent") or ""
        if choice == NEW_AGENT:
            name = form.cleaned_data.get("new_agent") or ""
            if not name.strip():
                # An empty box means what its placeholder shows: the client's name.
                application = self._application(form.cleaned_data.get("client_id"))
                taken = [agent.name for agent in accounts_services.list_agents(user_id=user_id)]
                suggested = oauth_services.agent_name_for(application) if application else ""
                name = oauth_services.unused_agent_name(suggested, taken) if suggested else ""
            return accounts_services.create_agent(user_id=user_id, name=name)
        try:
            agent_id = uuid.UUID(choice)
        except ValueError:
            raise NotFound("Choose the agent this connection acts as.") from None
        return accounts_services.get_agent(user_id=user_id, agent_id=agent_id)

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        form = context.get("form")
        application = kwargs.get("application") or self._application(self._field("client_id"))
        agents = accounts_services.list_agents(user_id=self.request.user.pk)
        suggested = oauth_services.agent_name_for(application) if application else "assistant"
        if application is not None:
            client = oauth_services.describe_client(application)
            context.update(
                application=application,
                client_name=client.name,
                client_origin=client.origin,
                registration=client.registration,
                verified=client.verified,
                redirect_host=_host(self._field("redirect_uri", kwargs)),
            )
        posted = form["agent"].value() if form is not None else None
        same_name = next((a for a in agents if a.name.lower() == suggested.lower()), None)
        typed = form["new_agent"].value() if form is not None and form.is_bound else None
        context.update(
            agents=agents,
            chosen_agent=posted or (str(same_name.id) if same_name else NEW_AGENT),
            new_agent=NEW_AGENT,
            # An agent of that name exists and is offered above; a new one needs another name.
            new_agent_name=typed if typed is not None else ("" if same_name else suggested),
            suggested_name=oauth_services.unused_agent_name(suggested, [a.name for a in agents]),
            resource_names=[
                path
                for path in resources.PATHS
                if any(
                    resources.same(uri, resources.identifier(path))
                    for uri in self._field("resource", kwargs).split()
                )
            ],
            switch_account_next=self._request_url(kwargs),
        )
        return context

    def render_to_response(self, context: dict[str, Any], **kwargs: Any) -> HttpResponse:
        if not context.get("error") and self._prompt_none():
            return self._consent_required()
        response: HttpResponse = super().render_to_response(context, **kwargs)
        if not context.get("error"):
            # Allow and Cancel are answered with a redirect to the client, which
            # the page's form-action governs too (core/csp.py).
            csp.allow_form_action(response, self._field("redirect_uri", context))
        # It holds a CSRF token, the account's email and its agents: no cache
        # keeps it (review146).
        patch_cache_control(response, no_store=True, private=True)
        return response

    def _prompt_none(self) -> bool:
        return self.request.method == "GET" and "none" in self.request.GET.get("prompt", "").split()

    def _consent_required(self) -> HttpResponse:
        """prompt=none asks that no page be shown (OpenID Connect Core 3.1.2.6): the user
        has not approved this client, so the client hears consent_required instead."""
        # The toolkit checked the redirect URI against the client before the page.
        params = [("error", "consent_required")]
        if self._field("state"):
            params.append(("state", self._field("state")))
        redirect_uri = self._field("redirect_uri")
        uri = redirect_uri + ("&" if "?" in redirect_uri else "?") + urlencode(params)
        application = self._application(self._field("client_id"))
        return self._named(self.redirect(uri, application))

    def _field(self, name: str, given: dict[str, Any] | None = None) -> str:
        """One oauth2 field of the request: from the GET handler, or the posted form."""
        if given and given.get(name):
            return str(given[name])
        if self.request.method == "POST":
            return self.request.POST.get(name, "")
        return str(self.oauth2_data.get(name) or "")

    def _request_url(self, given: dict[str, Any]) -> str:
        """The authorization request again, for after the user switches account."""
        params = [(name, self._field(name, given)) for name in REQUEST_FIELDS]
        pairs = [
            (name, part)
            for name, value in params
            if value
            for part in (value.split() if name == "resource" else [value])
        ]
        return reverse("oauth2_provider:authorize") + "?" + urlencode(pairs)

    @staticmethod
    def _application(client_id: str | None) -> Application | None:
        return oauth_services.find_application(client_id=client_id) if client_id else None


class SignInView(LoginView):
    """The sign-in page. Its form may lead on to a client, when the consent page is skipped.

    Chromium holds a form to the page's form-action through every redirect
    that answers it (core/csp.py). Signing in on the way to an authorization
    request that skips the consent page (ConsentView.get) ends at the
    client's redirect URI, so the page allows exactly that URI, once the
    toolkit would send the browser there.
    """

    def render_to_response(self, context: dict[str, Any], **kwargs: Any) -> HttpResponse:
        response: HttpResponse = super().render_to_response(context, **kwargs)
        destination = _consent_skipped_to(self.get_redirect_url())
        if destination:
            csp.allow_form_action(response, destination)
        return response


def _consent_skipped_to(next_url: str) -> str:
    """Return where ``next_url`` may send a browser without the consent page, or ''.

    That is the redirect URI of an authorization request whose client the
    operator trusts, or that asks ``approval_prompt=auto``, if the client
    registered it.
    """
    parts = urlsplit(next_url)
    if not next_url or parts.path != reverse("oauth2_provider:authorize"):
        return ""
    query = parse_qs(parts.query)
    application = oauth_services.find_application(client_id=query.get("client_id", [""])[0])
    if application is None or not application.is_usable(None):
        return ""
    if not application.skip_authorization and query.get("approval_prompt") != ["auto"]:
        return ""
    if "redirect_uri" in query:
        redirect_uri = query["redirect_uri"][0]
    else:
        try:
            redirect_uri = application.default_redirect_uri
        except errors.OAuth2Error:  # none, or several: the request is refused
            return ""
    return redirect_uri if redirect_uri and application.redirect_uri_allowed(redirect_uri) else ""


class JsonTokenView(TokenView):
    """The toolkit's token endpoint, whose refusals are always sent as JSON.

    An error raised while the token is stored (``invalid_target`` among them)
    reaches the toolkit without oauthlib's headers, and would go out as
    text/html; clients parse the body by its type.
    """

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            grant = request.POST.get("grant_type")
        except TooManyFieldsSent:
            # Caught here, it is a client's mistake answered in JSON, not Django's
            # error-level security log line that any caller could write.
            return _token_error("invalid_request", "The request has too many form fields.")
        except RequestDataTooBig:
            return _token_error("invalid_request", "The request body is too large.", status=413)
        if grant is not None and grant not in GRANT_TYPES:
            # Refused before oauthlib sees it: it checks a password grant's
            # username and password before it asks whether the client may use
            # the grant, and its two answers told a guesser which was right.
            return _token_error("unsupported_grant_type", f"Grant types: {', '.join(GRANT_TYPES)}.")
        response: HttpResponse = super().post(request, *args, **kwargs)
        if response.status_code >= 400 and response.content.startswith(b"{"):
            response["Content-Type"] = "application/json"
            response["Cache-Control"] = "no-store"
        return response

    def http_method_not_allowed(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        response = _token_error("invalid_request", "Use POST here.", status=405)
        response["Allow"] = "POST"
        return response


class JsonRevokeView(RevokeTokenView):
    """The toolkit's RFC 7009 endpoint, whose wrong-method answer is JSON as the token
    endpoint's is (it was an empty text/html 405: review146)."""

    def http_method_not_allowed(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        response = _token_error("invalid_request", "Use POST here.", status=405)
        response["Allow"] = "POST"
        return response


GRANT_TYPES = ("authorization_code", "refresh_token")


def _token_error(code: str, description: str, status: int = 400) -> HttpResponse:
    body = json.dumps({"error": code, "error_description": description})
    response = HttpResponse(body, status=status, content_type="application/json")
    response["Cache-Control"] = "no-store"
    return response


def _reason(error: Any, client_id: str = "") -> str:
    """Name why a request was refused, for the page (and the tests) to tell apart."""
    if isinstance(error, errors.InvalidClientIdError) and is_cimd_client_id(client_id):
        # An https client_id is a metadata document's address: unknown, it is one
        # that could not be fetched or broke the rules (oauth/cimd.py logs which).
        return "client_document_unusable"
    if isinstance(error, errors.InvalidClientIdError | errors.MissingClientIdError):
        return "unknown_client"
    if isinstance(
        error,
        errors.MismatchingRedirectURIError
        | errors.MissingRedirectURIError
        | errors.InvalidRedirectURIError,
    ):
        return "unregistered_redirect_uri"
    if isinstance(
        error,
        PlainChallenge
        | errors.MissingCodeChallengeError
        | errors.UnsupportedCodeChallengeMethodError,
    ):
        return "pkce_required"
    if getattr(error, "error", "") == "invalid_target":
        return "unknown_resource"
    return str(getattr(error, "error", "invalid_request"))


def _hostname(uri: str) -> str:
    try:
        return urlsplit(uri).hostname or ""
    except ValueError:
        return ""


def _host(uri: str) -> str:
    return urlsplit(uri).netloc or urlsplit(uri).scheme if uri else ""


def _granted(response: HttpResponse) -> bool:
    """Whether an authorization response sends the client a code: a redirect with no error."""
    if response.status_code not in (301, 302, 303):
        return False
    return not _refused_at(response.get("Location", ""))


def _with_issuer(uri: str, issuer: str) -> str:
    """``uri`` with ``iss`` set to ``issuer`` in its query, as the only one (RFC 9207)."""
    parts = urlsplit(uri)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "iss"]
    return urlunsplit(parts._replace(query=urlencode([*query, ("iss", issuer)])))


def _refused_at(uri: str) -> bool:
    """Whether a redirect to the client carries an error, in its query or its fragment."""
    location = urlsplit(uri)
    return "error" in parse_qs(location.query) or "error" in parse_qs(location.fragment)
