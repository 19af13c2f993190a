"""A model form that carries the version it showed: a stale post is refused.

:class:`VersionedModelForm` (the admin's :class:`~fencing.contrib.django.admin.FencedModelAdmin`
uses it) adds a hidden field, ``fencing_version``, holding the version of the instance
the form was shown for (a token of ``fencing.contrib.django.signer()`` when
``FENCING["SIGNING_KEYS"]`` is set, so it cannot be edited; the plain number
otherwise). When the form is posted, the instance is loaded again; if its version is
not the one the form was shown for, the form is invalid: a non-field error says the
row moved on and gives its current values, and each field whose current value is
not the posted one says what it is now. Nothing is written.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.utils.text import capfirst

from django import forms
from fencing import ConfigurationError, FencingError, Intent

from .models import version_field
from .stores import signer

__all__ = ["VERSION_FIELD", "VersionedModelForm", "version_token"]

#: The name of the hidden form field that carries the version.
VERSION_FIELD = "fencing_version"
#: The transition name of the intent a signed version is carried in.
_SHOWN = "change-form"
_LONGEST = 100  # characters of a current value quoted in the conflict message


def _signer() -> Any:
    try:
        return signer()
    except ConfigurationError:
        return None


def version_token(instance: Any) -> str:
    """What the form carries for ``instance``: its version, signed with
    ``signer()`` when signing keys are configured (an intent at that version)."""
    version = getattr(instance, version_field(type(instance)).attname)
    signing = _signer()
    if signing is None:
        return str(version)
    intent = Intent.new(type(instance)._meta.label_lower, _key(instance.pk), version, _SHOWN)
    return str(signing.sign(intent))


def _key(pk: Any) -> str | int:
    return pk if isinstance(pk, int) and not isinstance(pk, bool) else str(pk)


def _shown_version(token: str, instance: Any) -> int:
    """The version a posted token says the form was shown for; ``ValidationError`` if
    the token is not one this form made for this instance."""
    signing = _signer()
    if signing is None:
        try:
            version = int(token)
        except ValueError:
            version = -1
        if version < 0:
            raise ValidationError(_TAMPERED, code="fencing_version")
        return version
    try:
        intent = signing.verify(token)
    except FencingError:
        raise ValidationError(_TAMPERED, code="fencing_version") from None
    same = (intent.collection, str(intent.key), intent.transition) == (
        type(instance)._meta.label_lower,
        str(_key(instance.pk)),
        _SHOWN,
    )
    if not same or intent.expected_version is None:
        raise ValidationError(_TAMPERED, code="fencing_version")
    return int(intent.expected_version)


_TAMPERED = (
    "This form's version is missing or was altered, so it cannot tell whether the record"
    " changed since the page was opened. Nothing was saved: open the record again."
)


def _shown(value: Any) -> str:
    text = "—" if value in (None, "") else str(value)
    return text if len(text) <= _LONGEST else text[: _LONGEST - 1] + "…"


class VersionedModelForm(forms.ModelForm):  # type: ignore[misc]
    """A ``ModelForm`` of a :class:`~fencing.contrib.django.models.FencedModel` that
    refuses a post made from a page shown at an older version (see the module
    docstring). Subclass it, or mix it in first: ``class OrderForm(VersionedModelForm,
    MyOrderForm)``."""

    fencing_version = forms.CharField(widget=forms.HiddenInput, required=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields.get(VERSION_FIELD)
        if field is not None and self._fenced():
            field.initial = version_token(self.instance)
            self.initial[VERSION_FIELD] = field.initial

    def _fenced(self) -> bool:
        instance = self.instance
        return (
            instance is not None
            and not instance._state.adding
            and version_field(type(instance)) is not None
        )

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean()
        if not self._fenced() or VERSION_FIELD not in self.fields:
            return cleaned
        posted = str(self.data.get(self.add_prefix(VERSION_FIELD)) or "")
        shown = _shown_version(posted, self.instance)
        current = getattr(self.instance, version_field(type(self.instance)).attname)
        if shown != current:
            self._conflict(shown, current)
        return cleaned

    def _conflict(self, shown: int, current: int) -> None:
        """The instance (loaded when the form was posted) is the row as it is now."""
        instance = self.instance
        now = []
        for name in self.changed_data:
            if name == VERSION_FIELD or name not in self.fields:
                continue
            value = _shown(self._current(name))
            label = self.fields[name].label or capfirst(name.replace("_", " "))
            now.append(f"{label}: {value}")
            self.add_error(name, f"Not saved: the current value is {value}")
        values = "; ".join(now) if now else "no field of this form differs from what you posted"
        name = instance._meta.verbose_name
        raise ValidationError(
            f"This {name} was changed by someone else after you opened this page (you edited"
            f" version {shown}, it is at version {current} now), so your changes were not"
            f" saved. Its current values: {values}. Open it again to edit the current values.",
            code="stale",
        )

    def _current(self, name: str) -> Any:
        instance = self.instance
        try:
            field = instance._meta.get_field(name)
        except Exception:
            return self.initial.get(name)
        if getattr(field, "choices", None):
            return getattr(instance, f"get_{field.name}_display")()
        if field.many_to_many:
            return ", ".join(str(obj) for obj in getattr(instance, field.name).all())
        if field.is_relation:
            return getattr(instance, field.name)
        return field.value_from_object(instance)
