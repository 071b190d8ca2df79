"""Entry points: render one instance assignment, or every instance of a release."""
from __future__ import annotations

from tenants.choices import Engine
from tenants.rendering.sglang import render_sglang
from tenants.rendering.types import RenderedConfig, RenderTarget
from tenants.rendering.vllm import render_vllm


def render_assignment(assignment, endpoints: RenderTarget) -> RenderedConfig:
    """Render the engine command and files of one ``InstanceAssignment`` (engine taken from its release)."""
    engine = assignment.release.engine
    if engine == Engine.SGLANG:
        return render_sglang(assignment, endpoints)
    if engine == Engine.VLLM:
        return render_vllm(assignment, endpoints)
    raise ValueError(f"release {assignment.release.namespace!r} has unknown engine {engine!r}")


def render_release(release, endpoints: RenderTarget) -> list[RenderedConfig]:
    """One ``RenderedConfig`` per instance assignment of ``release``, ordered by node name and port."""
    assignments = release.assignments.select_related("node", "release__model__tenant").order_by("node__name", "port")
    return [render_assignment(assignment, endpoints) for assignment in assignments]
