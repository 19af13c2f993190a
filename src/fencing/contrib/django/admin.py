"""fencing in Django's admin.

* :class:`FencedModelAdmin` (or :class:`FencedAdminMixin` first in your own admin's
  bases): the change form of a :class:`~fencing.contrib.django.models.FencedModel`
  carries the version it showed (a hidden field, signed with ``signer()`` when
  ``FENCING["SIGNING_KEYS"]`` is set); a post from a page opened before the row moved
  on is answered with the form again, a message saying so and the current values,
  and nothing is written (never a server error).
* The recorded effects that need reconciling and the outbox, under the ``fencing``
  app of the admin index (registered on ``admin.site`` when Django's admin loads this
  module, as it does for every installed app): lists with filters, and the actions
  "mark reconciled" (idempotent), "retry" and "drop" (dead outbox rows). They go
  through the store's own API (``store(alias).effects_to_reconcile()``,
  ``pending_effects()``, ``mark_reconciled()``, ``outbox.pending()``, ``dead()``,
  ``retry()``, ``drop()``): the same as ``fencing reconcile`` and ``fencing outbox``.
"""

from __future__ import annotations

import time
import urllib.parse
from typing import Any, ClassVar

from django.apps import apps
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import flatten_fieldsets
from django.core import checks
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.safestring import mark_safe

from django import forms
from fencing import FencingError, OutboxRowError, RecordNotFound
from fencing._outbox import QUEUE_KINDS

from .entries import Effect, OutboxRow
from .errors import StaleSave
from .forms import VERSION_FIELD, VersionedModelForm, _shown_version, version_token
from .models import version_field
from .stores import store

__all__ = [
    "EffectAdmin",
    "FencedAdminMixin",
    "FencedInlineMixin",
    "FencedModelAdmin",
    "OutboxAdmin",
    "check_fenced_admins",
]


class FencedAdminMixin:
    """Put it first in a ``ModelAdmin``'s bases: ``class OrderAdmin(FencedAdminMixin,
    MyBaseAdmin)``. Its form becomes a
    :class:`~fencing.contrib.django.forms.VersionedModelForm` of your form (the hidden
    ``fencing_version`` field is added to your ``fields``/``fieldsets`` when they do
    not name it)."""

    form: Any
    model: Any

    def __init__(self, model: Any, admin_site: Any) -> None:
        super().__init__(model, admin_site)  # type: ignore[call-arg]
        self.form = _versioned(self.form)

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)  # type: ignore[misc]
        wanted = obj is not None and self.has_change_permission(request, obj)  # type: ignore[attr-defined]
        return _with_version(fieldsets, wanted)

    def get_inlines(self, request: HttpRequest, obj: Any) -> Any:
        """The inlines, those of a FencedModel with :class:`FencedInlineMixin` first."""
        inlines = super().get_inlines(request, obj)  # type: ignore[misc]
        return [_fenced_inline(inline) for inline in inlines]

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        view = super().changeform_view  # type: ignore[misc]
        try:
            response: HttpResponse = view(request, object_id, form_url, extra_context)
        except StaleSave:
            # The row moved on between the post's load of it and the save (the admin's
            # atomic block rolled everything back): validated again, the form now sees
            # the newer version and shows the conflict.
            if request.method != "POST":
                raise
            response = view(request, object_id, form_url, extra_context)
        return response

    def get_changelist_form(self, request: HttpRequest, **kwargs: Any) -> Any:
        """``list_editable`` rows carry the version the list showed (each row's hidden
        ``fencing_version``, beside its primary key): a row that moved on since is
        refused with the conflict and its current values, the list shown again."""
        if version_field(self.model) is not None:
            kwargs["form"] = _versioned(kwargs.get("form") or forms.ModelForm)
        return super().get_changelist_form(request, **kwargs)  # type: ignore[misc]

    def get_changelist_formset(self, request: HttpRequest, **kwargs: Any) -> Any:
        formset = super().get_changelist_formset(request, **kwargs)  # type: ignore[misc]
        if version_field(self.model) is None:
            return formset
        return type(formset.__name__, (_VersionedRows, formset), {})

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """A row that moves on between the list's load of it and its save (after the
        versions were checked) is refused, the admin's transaction rolled back, and
        the list shown again with a message."""
        try:
            response: HttpResponse = super().changelist_view(request, extra_context)  # type: ignore[misc]
        except StaleSave as refused:
            if request.method != "POST":
                raise
            self.message_user(  # type: ignore[attr-defined]
                request,
                f"{refused.instance} was changed by someone else while this list was saved:"
                " nothing was saved. Edit the list again.",
                messages.ERROR,
            )
            return HttpResponseRedirect(request.get_full_path())
        return response

    def render_delete_form(self, request: HttpRequest, context: dict[str, Any]) -> Any:
        """The delete confirmation page's form carries the version it showed."""
        response = super().render_delete_form(request, context)  # type: ignore[misc]
        shown = context.get("object")
        if shown is not None and version_field(type(shown)) is not None:
            response.context_data[VERSION_FIELD] = version_token(shown)
            if getattr(self, "delete_confirmation_template", None) is None:
                response.template_name = "fencing/admin/delete_confirmation.html"
        return response

    def delete_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """A delete confirmed on a page shown before the row moved on is refused:
        nothing is deleted, and the change page says so with the current values."""
        if request.method == "POST" and version_field(self.model) is not None:
            request._fencing_delete = str(request.POST.get(VERSION_FIELD) or "")
        try:
            response: HttpResponse = super().delete_view(request, object_id, extra_context)  # type: ignore[misc]
        except StaleSave as refused:
            if request.method != "POST":
                raise
            return self._not_deleted(request, refused)
        return response

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        """``obj.delete()`` at the version the confirmation page showed (the admin's
        delete view loads the object again when the page is posted)."""
        token = getattr(request, "_fencing_delete", None)
        field = version_field(type(obj))
        if token is not None and field is not None:
            try:
                shown = _shown_version(token, obj)
            except ValidationError:
                shown = None
            if shown != getattr(obj, field.attname):
                raise StaleSave(obj, shown, obj, getattr(obj, field.attname))
        super().delete_model(request, obj)  # type: ignore[misc]

    def _not_deleted(self, request: HttpRequest, refused: StaleSave) -> HttpResponse:
        name = self.model._meta.verbose_name
        current = refused.current
        if current is None:
            self.message_user(  # type: ignore[attr-defined]
                request, f"This {name} was deleted by someone else meanwhile.", messages.WARNING
            )
            info = (self.model._meta.app_label, self.model._meta.model_name)
            return HttpResponseRedirect(reverse("admin:{}_{}_changelist".format(*info)))
        saw = (
            "this page's version is missing or was altered"
            if refused.version is None
            else f"you saw version {refused.version}, it is at version {refused.current_version}"
            " now"
        )
        self.message_user(  # type: ignore[attr-defined]
            request,
            f"This {name} was changed by someone else after you opened the delete page"
            f" ({saw}), so it was not deleted. Its current values are shown below: delete"
            " it again from here if you still mean to.",
            messages.ERROR,
        )
        info = (self.model._meta.app_label, self.model._meta.model_name)
        url = reverse(
            "admin:{}_{}_change".format(*info),
            args=[current.pk],
            current_app=self.admin_site.name,  # type: ignore[attr-defined]
        )
        return HttpResponseRedirect(url)


class _VersionedRows:
    """A ``list_editable`` formset whose rows render their hidden version with their
    primary key (the change list renders only the primary key's hidden input)."""

    model: Any

    def add_fields(self, form: Any, index: Any) -> None:
        super().add_fields(form, index)  # type: ignore[misc]
        pk = self.model._meta.pk.name
        if pk in form.fields and VERSION_FIELD in form.fields:
            form.fields[pk].widget = _KeyAndVersion(form, form.fields[pk].widget.attrs)


class _KeyAndVersion(forms.HiddenInput):  # type: ignore[misc]
    def __init__(self, form: Any, attrs: Any = None) -> None:
        super().__init__(attrs)
        self._form = form

    def render(self, name: str, value: Any, attrs: Any = None, renderer: Any = None) -> Any:
        rendered = super().render(name, value, attrs, renderer)
        return mark_safe(rendered + str(self._form[VERSION_FIELD]))


def _versioned(form: Any) -> Any:
    if issubclass(form, VersionedModelForm):
        return form
    return type(form.__name__, (VersionedModelForm, form), {})


def _with_version(given: Any, wanted: bool) -> list[Any]:
    """``given`` fieldsets naming the hidden version field once if ``wanted``, else not."""
    fieldsets: list[Any] = list(given)
    listed = VERSION_FIELD in flatten_fieldsets(fieldsets)
    if wanted and not listed and fieldsets:
        name, options = fieldsets[-1]
        fields = [*options.get("fields", ()), VERSION_FIELD]
        fieldsets[-1] = (name, {**options, "fields": fields})
    elif listed and not wanted:
        fieldsets = [
            (name, {**options, "fields": _without(options.get("fields", ()))})
            for name, options in fieldsets
        ]
    return fieldsets


_inlines: dict[Any, Any] = {}


def _fenced_inline(inline: Any) -> Any:
    """``inline`` (a class), with :class:`FencedInlineMixin` first if its model is fenced."""
    from .models import version_field

    if version_field(inline.model) is None or issubclass(inline, FencedInlineMixin):
        return inline
    fenced = _inlines.get(inline)
    if fenced is None:
        fenced = type(
            inline.__name__, (FencedInlineMixin, inline), {"__module__": inline.__module__}
        )
        _inlines[inline] = fenced
    return fenced


class FencedInlineMixin:
    """Put it first in an inline's bases (``FencedAdminMixin`` does it for the inlines
    of a FencedModel): each row's form carries the version it showed, and a row that
    moved on since the page was opened is shown with the current values, nothing
    written (the whole change form is refused, as for any invalid row)."""

    form: Any

    def __init__(self, parent_model: Any, admin_site: Any) -> None:
        super().__init__(parent_model, admin_site)  # type: ignore[call-arg]
        self.form = _versioned(self.form)

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)  # type: ignore[misc]
        return _with_version(fieldsets, self.has_change_permission(request, obj))  # type: ignore[attr-defined]


def _without(fields: Any) -> Any:
    kept = []
    for entry in fields:
        if isinstance(entry, list | tuple):
            entry = type(entry)(name for name in entry if name != VERSION_FIELD)
            if entry:
                kept.append(entry)
        elif entry != VERSION_FIELD:
            kept.append(entry)
    return kept


class FencedModelAdmin(FencedAdminMixin, admin.ModelAdmin):  # type: ignore[misc]
    """A ``ModelAdmin`` for a :class:`~fencing.contrib.django.models.FencedModel`: see
    :class:`FencedAdminMixin`."""


class _StoreAdmin(admin.ModelAdmin):  # type: ignore[misc]
    """An admin page over a store's API instead of a queryset: one list, actions."""

    #: the database alias whose store the page shows
    using = "default"
    #: how many rows the page lists at most (the oldest first)
    limit = 100
    template = ""
    actions_allowed: ClassVar[dict[str, str]] = {}

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def get_urls(self) -> list[Any]:
        info = self.opts.app_label, self.opts.model_name
        view = self.admin_site.admin_view(self.changelist_view)
        return [path("", view, name="{}_{}_changelist".format(*info))]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_or_change_permission(request):
            from django.core.exceptions import PermissionDenied

            raise PermissionDenied
        if request.method == "POST":
            action = str(request.POST.get("action") or "")
            needs = self.actions_allowed.get(action)
            if needs is None:
                self.message_user(request, "No such action.", messages.ERROR)
            elif not getattr(self, f"has_{needs}_permission")(request):
                from django.core.exceptions import PermissionDenied

                raise PermissionDenied
            else:
                chosen = request.POST.getlist(ACTION_CHECKBOX_NAME)
                if not chosen:
                    self.message_user(request, "Select at least one row.", messages.WARNING)
                else:
                    getattr(self, f"do_{action}")(request, chosen)
            query = request.GET.urlencode()
            return HttpResponseRedirect(request.path + (f"?{query}" if query else ""))
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": self.opts.verbose_name_plural.capitalize(),
            "subtitle": None,
            "using": self.using,
            "action_choices": [
                (name, label)
                for name, label in self.action_labels()
                if getattr(self, f"has_{self.actions_allowed[name]}_permission")(request)
            ],
            **self.listing(request),
            **(extra_context or {}),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, self.template, context)

    def action_labels(self) -> list[tuple[str, str]]:
        raise NotImplementedError

    def listing(self, request: HttpRequest) -> dict[str, Any]:
        raise NotImplementedError


def _link(request: HttpRequest, **changes: str) -> str:
    query = {k: v for k, v in request.GET.items() if k not in changes}
    query.update({k: v for k, v in changes.items() if v})
    return "?" + urllib.parse.urlencode(query) if query else "?"


#: the age filter's choices (seconds)
AGES = (("", "any age"), ("3600", "1 hour or more"), ("86400", "1 day or more"),
        ("604800", "7 days or more"))  # fmt: skip


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{max(0.0, seconds):.0f}s"


class EffectAdmin(_StoreAdmin):
    """Recorded effects: those that need reconciling (their intent ended stale, fenced,
    contended or missing, or its task was abandoned), or, with the "pending" state,
    those whose work has neither committed nor ended (a task that made its call and
    vanished); filtered by age; "mark reconciled" marks the chosen ones (idempotent:
    marking one again changes nothing)."""

    template = "fencing/admin/effects.html"
    actions_allowed: ClassVar[dict[str, str]] = {"mark_reconciled": "change"}

    def action_labels(self) -> list[tuple[str, str]]:
        return [("mark_reconciled", "Mark the selected effects reconciled")]

    def listing(self, request: HttpRequest) -> dict[str, Any]:
        state = request.GET.get("state", "reconcile")
        state = state if state in ("reconcile", "pending") else "reconcile"
        age = request.GET.get("age", "")
        age = age if age in dict(AGES) else ""
        now = time.time()
        found = store(self.using)
        if state == "pending":
            effects = found.pending_effects(older_than=float(age or 0), limit=self.limit)
        else:
            effects = found.effects_to_reconcile(limit=self.limit)
            if age:
                effects = [e for e in effects if now - e.recorded_at >= float(age)]
        rows = [
            {
                "key": e.idempotency_key,
                "where": f"{e.collection}/{e.key}",
                "intent": f"{e.transition} {e.intent_id}",
                "name": e.name,
                "status": e.status,
                "outcome": e.outcome or "",
                "age": _age(now - e.recorded_at),
                "detail": "" if e.detail is None else str(e.detail)[:80],
            }
            for e in effects
        ]
        states = [("reconcile", "need reconciling"), ("pending", "pending, work vanished")]
        return {
            "rows": rows,
            "full": len(effects) == self.limit,
            "limit": self.limit,
            "filters": [
                (
                    "state",
                    [(label, _link(request, state=v), v == state) for v, label in states],
                ),
                ("age", [(label, _link(request, age=v), v == age) for v, label in AGES]),
            ],
        }

    def do_mark_reconciled(self, request: HttpRequest, keys: list[str]) -> None:
        marked = already = 0
        found = store(self.using)
        for key in keys:
            try:
                before = found.get_effect(key)
                found.mark_reconciled(key)
            except RecordNotFound:
                self.message_user(request, f"No effect {key}.", messages.WARNING)
                continue
            if before is not None and before.reconciled:
                already += 1
            else:
                marked += 1
        text = f"Marked {marked} effect(s) reconciled"
        if already:
            text += f" ({already} already were)"
        self.message_user(request, text + ".", messages.SUCCESS)


class OutboxAdmin(_StoreAdmin):
    """The outbox: pending rows (to publish) or dead ones (given up by a relay's
    ``dead_after``), of one queue kind or all; "retry" puts the chosen dead rows back
    to pending, "drop" deletes them (all of them or none)."""

    template = "fencing/admin/outbox.html"
    actions_allowed: ClassVar[dict[str, str]] = {"retry": "change", "drop": "delete"}

    def action_labels(self) -> list[tuple[str, str]]:
        return [
            ("retry", "Retry the selected dead rows (back to pending)"),
            ("drop", "Drop the selected dead rows (never published)"),
        ]

    def listing(self, request: HttpRequest) -> dict[str, Any]:
        state = request.GET.get("state", "pending")
        state = state if state in ("pending", "dead") else "pending"
        kind = request.GET.get("kind", "")
        kind = kind if kind in QUEUE_KINDS else ""
        outbox = store(self.using).outbox
        stats = outbox.stats(kind=kind or None)
        if state == "dead":
            found = outbox.dead(kind=kind or None, limit=self.limit)
        else:
            found = outbox.pending(kind=kind or None, limit=self.limit)
        rows = [
            {
                "id": r.id,
                "kind": r.kind,
                "task": r.task,
                "queue": r.queue or "",
                "key": r.key,
                "age": _age(r.age(stats.now)),
                "attempts": r.attempts,
                "error": (r.last_error or "")[:120],
                "state": r.state,
            }
            for r in found
        ]
        kinds = [("", "all"), *((k, k) for k in QUEUE_KINDS)]
        extra: dict[str, Any] = (
            {} if state == "dead" else {"action_choices": []}
        )  # only dead rows change
        return {
            **extra,
            "rows": rows,
            "state": state,
            "stats": stats,
            "full": len(found) == self.limit,
            "limit": self.limit,
            "filters": [
                (
                    "state",
                    [
                        (
                            f"pending ({stats.pending})",
                            _link(request, state="pending"),
                            state == "pending",
                        ),
                        (f"dead ({stats.dead})", _link(request, state="dead"), state == "dead"),
                    ],
                ),
                ("kind", [(label, _link(request, kind=v), v == kind) for v, label in kinds]),
            ],
        }

    def _change(self, request: HttpRequest, chosen: list[str], verb: str) -> None:
        try:
            ids = [int(value) for value in chosen]
        except ValueError:
            self.message_user(request, "Outbox rows are chosen by their ids.", messages.ERROR)
            return
        outbox = store(self.using).outbox
        try:
            done = outbox.retry(ids) if verb == "retry" else outbox.drop(ids)
        except OutboxRowError as refused:
            self.message_user(request, str(refused), messages.ERROR)
            return
        except FencingError as failed:
            self.message_user(request, f"{verb} failed: {failed}", messages.ERROR)
            return
        what = "put back to pending" if verb == "retry" else "dropped"
        self.message_user(request, f"{done} dead outbox row(s) {what}.", messages.SUCCESS)

    def do_retry(self, request: HttpRequest, chosen: list[str]) -> None:
        self._change(request, chosen, "retry")

    def do_drop(self, request: HttpRequest, chosen: list[str]) -> None:
        self._change(request, chosen, "drop")


def check_fenced_admins(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """``fencing_admin.W001``: a FencedModel registered on an admin site with an admin
    whose change form does not carry its version (not a :class:`FencedAdminMixin`):
    a page opened before the row moved on would be saved over it, or, if the row moves
    during the post, answered with a server error."""
    from django.contrib.admin.sites import all_sites

    from .models import version_field

    found = []
    for site in list(all_sites):
        for model, model_admin in list(site._registry.items()):
            if version_field(model) is None or isinstance(model_admin, FencedAdminMixin):
                continue
            if app_configs is not None and model._meta.app_config not in app_configs:
                continue
            found.append(
                checks.Warning(
                    f"{model._meta.label} is a fenced model registered on the admin site"
                    f" {site.name!r} with {type(model_admin).__name__}, whose change form"
                    " does not carry the version it showed",
                    hint="register it with fencing.contrib.django.admin.FencedModelAdmin"
                    " (or put FencedAdminMixin first in your admin's bases), or use"
                    " fencing.contrib.django.adminapp.FencedAdminConfig in INSTALLED_APPS"
                    " in place of django.contrib.admin",
                    obj=model_admin,
                    id="fencing_admin.W001",
                )
            )
    return found


checks.register(check_fenced_admins, checks.Tags.admin)
if apps.is_installed("django.contrib.admin"):  # (admin.site needs it; a site of yours not)
    admin.site.register(Effect, EffectAdmin)
    admin.site.register(OutboxRow, OutboxAdmin)
