"""Lists of the pages at fleet size: paginated (Django ``Paginator``), sortable by whitelisted keys and searchable,
all in SQL — one helper for every list, and one pager (``templates/ui/_pager.html``, template tags
``dashboard.templatetags.listing``).

Query parameters of a list with prefix ``p`` (empty for a page's only list): ``?pq=`` words to look for
(case-insensitive, each must occur in one of the list's search fields), ``?psort=key`` or ``?psort=-key``
(descending; a key the list does not offer falls back to the default), ``?ppage=N`` (Django's ``get_page``: out of
range shows the last page). Several lists on one page take different prefixes and keep each other's parameters.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from django.core.paginator import Page, Paginator
from django.db.models import Count, Model, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpRequest, QueryDict

#: Rows per page of a list.
PER_PAGE = 25
#: Longest search text read (characters), and most words in it; the rest is ignored.
MAX_SEARCH_LENGTH = 100
MAX_SEARCH_TERMS = 5


@dataclass(frozen=True)
class Listing:
    """One list of a page as shown: its ``page`` of rows, the ``sort`` in effect (``key`` or ``-key``), the search
    text ``q``, and what the template tags need to build links (``params``: the request's query parameters)."""

    page: Page
    sort: str
    q: str
    prefix: str
    sorts: tuple[str, ...]
    params: QueryDict
    q_param: str

    @property
    def rows(self):
        """The rows of the page shown."""
        return self.page.object_list

    @property
    def count(self) -> int:
        """Rows of the whole list (after the search)."""
        return self.page.paginator.count

    @property
    def sort_param(self) -> str:
        return f"{self.prefix}sort"

    @property
    def page_param(self) -> str:
        return f"{self.prefix}page"

    @property
    def clear_url(self) -> str:
        """The current URL without this list's search (and page)."""
        return self.url(q=None, page=None)

    def url(self, **changes: str | int | None) -> str:
        """``?query`` of the current URL with this list's parameters changed (``sort=``, ``page=``, ``q=``; ``None``
        removes one); the other lists' parameters stay."""
        params = self.params.copy()
        for name, value in changes.items():
            key = self.q_param if name == "q" else f"{self.prefix}{name}"
            params.pop(key, None)
            if value not in (None, ""):
                params[key] = str(value)
        encoded = params.urlencode()
        return f"?{encoded}" if encoded else "?"


def search_text(raw: str | None) -> str:
    """The search text of a query parameter: whitespace-trimmed, at most ``MAX_SEARCH_LENGTH`` characters."""
    return (raw or "").strip()[:MAX_SEARCH_LENGTH]


def search(queryset: QuerySet, text: str, fields: Sequence[str]) -> QuerySet:
    """Rows of ``queryset`` in which every word of ``text`` (at most ``MAX_SEARCH_TERMS``) occurs in one of
    ``fields`` (``icontains``); all rows for a blank text."""
    for term in text.split()[:MAX_SEARCH_TERMS]:
        condition = Q()
        for name in fields:
            condition |= Q(**{f"{name}__icontains": term})
        queryset = queryset.filter(condition)
    return queryset


def paginate(request: HttpRequest, queryset: QuerySet, *, sorts: Mapping[str, Sequence[str]], default: str,
             search_fields: Sequence[str] = (), prefix: str = "", per_page: int = PER_PAGE,
             q_param: str | None = None) -> Listing:
    """The ``Listing`` of ``queryset`` for this request (see the module docstring).

    Args:
        sorts: sort key offered in the URL -> the ``order_by`` terms it means (a leading ``-`` on the key
            reverses every term); the primary key is added last, so pages neither repeat nor skip rows.
        default: the sort key (with ``-`` for descending) when the URL names none or one not in ``sorts``.
        search_fields: lookups searched by ``?q=``.
        prefix: prefix of this list's parameter names.
        q_param: the search parameter when not ``<prefix>q`` (lists of one page searched by one box: ``"q"``).

    Two queries: the count and the page (plus whatever the queryset prefetches).
    """
    q_param = q_param or f"{prefix}q"
    q = search_text(request.GET.get(q_param))
    rows = search(queryset, q, search_fields) if search_fields else queryset
    sort = request.GET.get(f"{prefix}sort", "").strip()
    if sort.removeprefix("-") not in sorts:
        sort = default
    descending = sort.startswith("-")
    terms = [term.removeprefix("-") if term.startswith("-") == descending else f"-{term.removeprefix('-')}"
             for term in sorts[sort.removeprefix("-")]]
    rows = rows.order_by(*terms, "-pk" if descending else "pk")
    page = Paginator(rows, per_page).get_page(request.GET.get(f"{prefix}page"))
    return Listing(page=page, sort=sort, q=q, prefix=prefix, sorts=tuple(sorts), params=request.GET, q_param=q_param)


def paginate_lines(request: HttpRequest, lines: Sequence[str], *, per_page: int = PER_PAGE) -> Listing:
    """The ``Listing`` of text lines (a check's details): those containing every word of ``?q=``
    (case-insensitive), ``?page=`` of them, in their order (no sort keys)."""
    q = search_text(request.GET.get("q"))
    words = q.lower().split()[:MAX_SEARCH_TERMS]
    shown = [line for line in lines if all(word in line.lower() for word in words)]
    page = Paginator(shown, per_page).get_page(request.GET.get("page"))
    return Listing(page=page, sort="", q=q, prefix="", sorts=(), params=request.GET, q_param="q")


def count_of(rows: type[Model] | QuerySet, link: str) -> Coalesce:
    """An annotation counting the rows of ``rows`` (a model, or a queryset such as the rows a user may see) whose
    ``link`` points at the outer row: a correlated subquery, so several counts on one list do not multiply each
    other as joins would, and no query per row."""
    queryset = rows._default_manager.all() if isinstance(rows, type) else rows
    counted = (queryset.filter(**{link: OuterRef("pk")}).order_by().values(link).annotate(n=Count("pk"))
               .values("n"))
    return Coalesce(Subquery(counted), 0)
