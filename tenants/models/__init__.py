"""Registry models (one module per model family); import them from here."""
from tenants.models.audit import AuditEntry
from tenants.models.membership import TenantMembership
from tenants.models.node import InstanceAssignment, Node
from tenants.models.release import Release
from tenants.models.request_group import RequestGroup
from tenants.models.reserved_engine_user import ReservedEngineUser
from tenants.models.reserved_namespace import ReservedNamespace
from tenants.models.reserved_salt import ReservedSalt
from tenants.models.reserved_tenant_id import ReservedTenantId
from tenants.models.served_model import ServedModel
from tenants.models.tenant import Tenant

__all__ = ["AuditEntry", "InstanceAssignment", "Node", "Release", "RequestGroup", "ReservedEngineUser",
           "ReservedNamespace", "ReservedSalt",
           "ReservedTenantId", "ServedModel", "Tenant", "TenantMembership"]
