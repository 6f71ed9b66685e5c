"""A prepared read binds each value where it reaches the statement as given; one that also reaches it changed
(a LIKE pattern built from it) is refused when the read is first run, instead of that condition keeping the
marker for good and silently never matching (an ``exclude`` that excludes nothing)."""

from __future__ import annotations

import pytest

from approvals.models import Team
from approvals.prepared import Many, PreparedRead
from tests import factories

pytestmark = pytest.mark.django_db


def test_a_value_also_used_as_a_pattern_is_refused_rather_than_left_unbound() -> None:
    factories.team("ops")
    Team.objects.filter(slug="ops").update(name="ops (retired)")
    slug = Team._meta.get_field("slug")
    not_retired = PreparedRead(lambda s: Team.objects.filter(slug=s).exclude(name__startswith=s), s=slug)

    assert list(Team.objects.filter(slug="ops").exclude(name__startswith="ops")) == []
    with pytest.raises(TypeError, match="as they are given"):
        not_retired(s="ops")


def test_reads_whose_values_reach_the_statement_as_given_still_run() -> None:
    ops, release = factories.team("ops"), factories.team("release")
    slug = Team._meta.get_field("slug")
    by_slug = PreparedRead(lambda a, b: Team.objects.filter(slug__in=[a, b]).order_by("slug"), a=slug, b=slug)
    by_pk = PreparedRead(lambda pks: Team.objects.filter(pk__any=pks), pks=Many(Team._meta.pk))

    assert by_slug(a="release", b="ops") == [ops, release]
    assert by_slug(a="ops", b="nobody") == [ops]
    assert by_pk(pks=[release.pk]) == [release]
