"""Node-level processes: the ``mooncake_client`` (Mooncake 0.3.13.post1) that owns a standalone-store node's segment."""
from __future__ import annotations

from tenants.choices import StoreMode
from tenants.rendering.types import RenderedConfig, RenderTarget

#: ``argv[0]`` of the rendered store client: the node resolves it (the Mooncake wheel's package directory, the
#: agent interpreter's ``bin``, then ``PATH``; see ``agent.node.segment.find_client_binary``).
STORE_CLIENT_BINARY = "mooncake_client"


def render_store_client(node, endpoints: RenderTarget) -> RenderedConfig | None:
    """``mooncake_client`` flags of ``node`` (a ``tenants.models.Node``), or ``None`` in ``embedded`` mode.

    ``--host`` = the node's hostname (its transfer engine's address), ``--port`` = ``store_client_port``,
    ``--master_server_address`` / ``--metadata_server`` / ``--protocol`` from ``endpoints``,
    ``--global_segment_size`` = ``store_segment_bytes`` (plain bytes, which the client parses), and
    ``--device_names`` when ``endpoints.device_name`` is set (RDMA). No ``--tenant_id``: the client only lends
    memory, and writes are charged to the writing engine's tenant (seen with a multi-tenant master), so one
    client per node serves every tenant.
    """
    if node.store_mode != StoreMode.STANDALONE:
        return None
    host = node.hostname[1:-1] if node.hostname.startswith("[") and node.hostname.endswith("]") else node.hostname
    argv = [
        STORE_CLIENT_BINARY,
        f"--host={host}",
        f"--port={node.store_client_port}",
        f"--master_server_address={endpoints.master_server_address}",
        f"--metadata_server={endpoints.metadata_server}",
        f"--protocol={endpoints.protocol}",
        f"--global_segment_size={node.store_segment_bytes}",
    ]
    if endpoints.device_name:
        argv.append(f"--device_names={endpoints.device_name}")
    return RenderedConfig(
        kind="mooncake_client",
        argv=argv,
        meta={"node": node.name, "store_mode": node.store_mode, "store_segment_bytes": node.store_segment_bytes},
    )
