"""Reads of a fixed shape, compiled to SQL once per process.

Django compiles a queryset to SQL each time it runs it. For a wide ``select_related`` read that is most of
the read's CPU: under the load benchmark, compiling the queue card's seven-table read was more than a third
of the card's cost, and SQL compilation 13 % of the web process's CPU (``docs/performance.md``).

A :class:`PreparedRead` builds its queryset once with marker values in place of the caller's, compiles it,
and remembers where the markers sit among the statement's parameters. Each run executes the same SQL with
the caller's values and builds the model instances with Django's own ``ModelIterable``, exactly as the
queryset would (related objects from ``select_related``, deferred fields, converters; rows of ``values()``).

Only what never changes shape fits: no ``__in`` with a list of varying length, and each value reaches the SQL
as given (a pattern built from it, ``startswith`` or ``contains``, is refused when the read is compiled). A
list of values fits as one parameter, through the ``any`` lookup (``team__any=[1, 2]``:
``team_id = ANY(%s::bigint[])``, the plan PostgreSQL makes of an ``IN`` list) and a :class:`Many` field. A
value is converted as its field converts it (a UUID given as text, a key given as a model instance).
"""

from __future__ import annotations

import copy
import datetime
import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from django.db import connections, models, router
from django.db.models import Lookup
from django.db.models.query import QuerySet
from django.db.models.sql.compiler import SQLCompiler
from django.db.transaction import TransactionManagementError

T = TypeVar("T")


class AnyOf(Lookup):
    """``field__any=[...]``: the column equals one of a list, sent as one array parameter, so the statement
    has one shape whatever the list's length (an empty list matches nothing)."""

    lookup_name = "any"
    prepare_rhs = False

    def get_prep_lookup(self) -> list[Any]:
        if isinstance(self.rhs, (str, bytes)) or not isinstance(self.rhs, Iterable):
            raise TypeError(f"the any lookup takes a list of values, not {type(self.rhs).__name__}")
        field = self.lhs.output_field
        target = field.target_field if isinstance(field, models.ForeignKey) else field
        values = [value.pk if isinstance(value, models.Model) else value for value in self.rhs]
        if any(value is None for value in values):
            raise ValueError("the any lookup cannot compare with None")
        return [target.get_prep_value(value) for value in values]

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, list[Any]]:
        lhs, lhs_params = self.process_lhs(compiler, connection)
        db_type = self.lhs.output_field.db_type(connection)
        return f"{lhs} = ANY(%s::{db_type}[])", [*lhs_params, list(self.rhs)]


models.ForeignKey.register_lookup(AnyOf)
models.IntegerField.register_lookup(AnyOf)
models.UUIDField.register_lookup(AnyOf)


@dataclass(frozen=True)
class Many:
    """A prepared read's value that is a list of the field's values (for the ``any`` lookup)."""

    field: models.Field[Any, Any]


@dataclass(frozen=True)
class _Compiled:
    """One database's statement: the queryset built with markers, its compiler holding the select list, and
    where each value goes among the parameters."""

    queryset: QuerySet[Any, Any]
    compiler: SQLCompiler
    sql: str
    params: tuple[Any, ...]
    slots: dict[str, list[int]]

    @property
    def locks(self) -> bool:
        """Django refuses a locking read outside a transaction; so does this."""
        return bool(self.compiler.query.select_for_update)

    def compiler_with(self, db: str, values: dict[str, Any]) -> SQLCompiler:
        params = list(self.params)
        for name, positions in self.slots.items():
            for position in positions:
                params[position] = values[name]
        frozen = copy.copy(self.compiler)
        frozen.connection = connections[db]  # this thread's connection, not the compiling thread's
        statement = (self.sql, tuple(params))
        frozen.as_sql = lambda *args, **kwargs: statement  # type: ignore[method-assign]
        return frozen


def _marker(field: models.Field[Any, Any], index: int) -> Any:
    """A value of the field's type that no caller passes, to find in the compiled parameters."""
    target = field.target_field if isinstance(field, models.ForeignKey) else field
    if isinstance(target, models.UUIDField):
        return uuid.UUID(int=(0xE11C17 << 100) + index)
    if isinstance(target, (models.IntegerField, models.AutoField)):
        return -(2**31) + 7919 + index
    if isinstance(target, models.CharField):
        return f"\x1fprepared-marker-{index}\x1f"
    if isinstance(target, models.DateTimeField):
        return datetime.datetime(1901, 2, 3, 4, 5, 6, 7000 + index, tzinfo=datetime.UTC)
    raise TypeError(f"a prepared read cannot bind {type(target).__name__} ({field.name})")


def _texts(value: Any) -> list[str]:
    """How a marker (or a list of them) reads inside a text parameter built from it."""
    values = value if isinstance(value, list) else [value]
    texts = []
    for item in values:
        if isinstance(item, str):
            texts.append(item)  # with its delimiters: marker 1 is no part of marker 10
        elif isinstance(item, uuid.UUID):
            texts.extend((str(item), item.hex))
    return texts


def _changed_on_the_way(value: Any, params: Iterable[Any], positions: list[int]) -> bool:
    """Whether the marker `value` also reaches the statement changed, in a parameter other than its own
    (``positions``): a text parameter, or a list of them, that holds it."""
    texts = _texts(value)
    if not texts:
        return False
    for i, param in enumerate(params):
        if i in positions:
            continue
        for item in param if isinstance(param, list) else [param]:
            if isinstance(item, str) and any(text in item for text in texts):
                return True
    return False


class PreparedRead(Generic[T]):
    """A queryset of fixed shape whose SQL is compiled once per process and database.

    ``build`` takes the values by name and returns the queryset; ``fields`` names the model field each
    value is compared with, for its marker and its conversion::

        card = PreparedRead(
            lambda round_id: InputRequest.objects.select_related("round").filter(round_id=round_id),
            round_id=InputRequest._meta.get_field("round"),
        )
        requests = card(round_id=7)

    A run gives the list the queryset would give: model instances, or rows of ``values()`` and
    ``values_list()``; ``prefetch_related`` lookups run as Django runs them (their own statements are
    compiled each time).
    """

    def __init__(self, build: Callable[..., QuerySet[Any, T]], **fields: models.Field[Any, Any] | Many):
        self.build, self.fields = build, fields
        self._compiled: dict[str, _Compiled] = {}
        self._model_class: type[models.Model] | None = None
        self._lock = threading.Lock()

    def __call__(self, **values: Any) -> list[T]:
        if values.keys() != self.fields.keys():
            raise TypeError(f"expected values for {sorted(self.fields)}, got {sorted(values)}")
        db = router.db_for_read(self._model())
        compiled = self._compiled.get(db) or self._compile(db)
        connection = connections[db]
        if compiled.locks and connection.get_autocommit():
            raise TransactionManagementError("select_for_update cannot be used outside of a transaction.")
        bound = {name: self._prepare(name, value, connection) for name, value in values.items()}
        compiler = compiled.compiler_with(db, bound)
        queryset = compiled.queryset._chain()  # type: ignore[attr-defined]
        queryset.query.get_compiler = lambda using=None, connection=None, elide_empty=True: compiler
        return list(queryset)

    def first(self, **values: Any) -> T | None:
        """The first row, or None (the builder slices ``[:1]`` where more than one could match)."""
        return next(iter(self(**values)), None)

    def _markers(self) -> dict[str, Any]:
        markers: dict[str, Any] = {}
        for i, (name, field) in enumerate(self.fields.items()):
            markers[name] = [_marker(field.field, i)] if isinstance(field, Many) else _marker(field, i)
        return markers

    def _model(self) -> type[models.Model]:
        if self._model_class is None:
            self._model_class = self.build(**self._markers()).model
        return self._model_class

    def _prepare(self, name: str, value: Any, connection: Any) -> Any:
        field = self.fields[name]
        if isinstance(field, Many):
            if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
                raise TypeError(f"{name} takes a list of values")
            return [self._converted(name, field.field, item, connection) for item in value]
        return self._converted(name, field, value, connection)

    @staticmethod
    def _converted(name: str, field: models.Field[Any, Any], value: Any, connection: Any) -> Any:
        if value is None:  # Django would write IS NULL, a statement of another shape
            raise ValueError(f"a prepared read cannot compare {name} with None")
        if isinstance(value, models.Model):
            value = value.pk
        target = field.target_field if isinstance(field, models.ForeignKey) else field
        return target.get_db_prep_value(target.to_python(value), connection, prepared=False)

    def _compile(self, db: str) -> _Compiled:
        with self._lock:
            if db in self._compiled:
                return self._compiled[db]
            markers = self._markers()
            queryset = self.build(**markers).using(db)
            compiler = queryset.query.get_compiler(using=db)
            sql, params = compiler.as_sql()
            connection = connections[db]
            wanted = {name: self._prepare(name, marker, connection) for name, marker in markers.items()}
            slots = {
                name: [i for i, param in enumerate(params) if type(param) is type(value) and param == value]
                for name, value in wanted.items()
            }
            missing = [name for name, positions in slots.items() if not positions]
            if missing:
                raise TypeError(f"a prepared read's values must reach its SQL as parameters: {missing}")
            changed = [
                name for name, value in wanted.items() if _changed_on_the_way(value, params, slots[name])
            ]
            if changed:
                # Each run sets the value at its slots only: a copy changed on its way (a LIKE pattern) would
                # keep the marker, and its condition would silently never match (an exclude() that excludes
                # nothing).
                raise TypeError(
                    f"a prepared read's values must reach its SQL as they are given, not changed by a lookup "
                    f"(startswith, contains...): {changed}"
                )
            # Each run sets its own thread's connection; the compiling thread's is not kept alive by this.
            compiler.connection = None
            self._compiled[db] = _Compiled(queryset, compiler, sql, tuple(params), slots)
            return self._compiled[db]


_REFRESHES: dict[
    tuple[type[models.Model], tuple[str, ...]], tuple[list[Any], PreparedRead[tuple[Any, ...]]]
] = {}


def refresh(instance: models.Model, fields: Iterable[str]) -> None:
    """``instance.refresh_from_db(fields=fields)`` with one statement per model and field list, compiled once
    per process: the row's current values of those fields (a JSON field decoded, a foreign key's id, whose
    cached object is dropped when the id changed), set on the instance. Raises the model's
    ``DoesNotExist`` when the row is gone."""
    model = type(instance)
    key = (model, tuple(fields))
    if key not in _REFRESHES:
        concrete: list[Any] = [model._meta.get_field(name) for name in key[1]]
        attnames = [field.attname for field in concrete]
        read = PreparedRead(
            lambda pk: model._base_manager.filter(pk=pk).values_list(*attnames)[:1], pk=model._meta.pk
        )
        _REFRESHES.setdefault(key, (concrete, read))
    concrete, read = _REFRESHES[key]
    row = read.first(pk=instance.pk)
    if row is None:
        raise model.DoesNotExist(f"{model.__name__} {instance.pk} is gone")  # type: ignore[attr-defined]
    for field, value in zip(concrete, row, strict=True):
        if field.is_relation and getattr(instance, field.attname) != value and field.is_cached(instance):
            field.delete_cached_value(instance)
        setattr(instance, field.attname, value)
