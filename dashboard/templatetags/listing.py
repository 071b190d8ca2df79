"""Template tags of the pages' lists (``dashboard.views.listing.Listing``): ``{% sort_header list "key" "label" %}``
a column header that sorts by ``key`` (again: reversed), ``{% pager list %}`` the page links, ``{% list_search list
%}`` the search box."""
from __future__ import annotations

from django import template
from django.utils.html import format_html

from dashboard.views.listing import Listing

register = template.Library()


@register.simple_tag
def sort_header(listing: Listing, key: str, label: str = "") -> str:
    """``<a>`` sorting the list by ``key`` (ascending, or descending when it is sorted ascending by it now), with
    an arrow on the column in effect and ``aria-sort``-style ``data-sort`` state for tests and screen readers."""
    label = label or key
    if listing.sort == key:
        target, arrow, state = f"-{key}", " ▲", "ascending"
    elif listing.sort == f"-{key}":
        target, arrow, state = key, " ▼", "descending"
    else:
        target, arrow, state = key, "", "none"
    return format_html('<a class="sort" href="{}" data-sort-key="{}" data-sort="{}">{}{}</a>',
                       listing.url(sort=target, page=None), key, state, label, arrow)


@register.inclusion_tag("ui/_pager.html")
def pager(listing: Listing) -> dict:
    """Page links of ``listing``: first / previous / "page N of M (K rows)" / next / last."""
    page = listing.page
    return {
        "listing": listing, "page": page,
        "first": listing.url(page=None) if page.has_previous() else "",
        "previous": listing.url(page=page.previous_page_number()) if page.has_previous() else "",
        "next": listing.url(page=page.next_page_number()) if page.has_next() else "",
        "last": listing.url(page=page.paginator.num_pages) if page.has_next() else "",
    }


@register.inclusion_tag("ui/_list_search.html")
def list_search(listing: Listing, placeholder: str = "search") -> dict:
    """A ``GET`` form searching ``listing`` (``?<prefix>q=``), keeping the other parameters but this list's page."""
    hidden = [(name, value) for name, values in listing.params.lists() for value in values
              if name not in (listing.q_param, listing.page_param)]
    return {"listing": listing, "hidden": hidden, "placeholder": placeholder}
