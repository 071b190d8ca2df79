"""Nodes declare the directories their engines may load from (``Node.model_roots``, ``tenants.placement``), and a
weights revision may not start with '-' (it is an engine argument).

So that nothing placed today stops working, each existing node gets as roots the directories its instances load
from now: the parent directory of every absolute model path and adapter path of its instances (the path itself
when its parent is '/'), in normal form. A node without such instances, and every new node, starts with no roots:
hub ids only, until a platform admin adds some.
"""
import posixpath

import tenants.validators
from django.db import migrations, models


def root_of(path: str) -> str:
    """The root that keeps ``path`` (absolute) loadable: its parent directory, or itself below '/'."""
    normal = posixpath.normpath(path)
    parent = posixpath.dirname(normal)
    return normal if parent == "/" else parent


def seed_roots(apps, schema_editor):
    Node = apps.get_model("tenants", "Node")
    InstanceAssignment = apps.get_model("tenants", "InstanceAssignment")
    roots: dict[int, set[str]] = {}
    for node_id, model_path, adapters in InstanceAssignment.objects.values_list(
            "node_id", "release__model__model_path", "release__adapters"):
        paths = [model_path] + [entry.get("path") for entry in adapters or [] if isinstance(entry, dict)]
        for path in paths:
            if isinstance(path, str) and path.startswith("/") and not path.startswith("//") and path != "/":
                roots.setdefault(node_id, set()).add(root_of(path))
    for node_id, found in roots.items():
        # a root below another one adds nothing
        kept = sorted(root for root in found
                      if not any(root != other and root.startswith(other + "/") for other in found))
        Node.objects.filter(pk=node_id).update(model_roots=kept)


class Migration(migrations.Migration):

    dependencies = [
        ('tenants', '0011_reserved_tenant_id'),
    ]

    operations = [
        migrations.AddField(
            model_name='node',
            name='model_roots',
            field=models.JSONField(blank=True, default=list, help_text="Absolute directories (normal form) the node's engines may load models and adapters from; an absolute model_path or adapter path must lie under one. Empty: hub ids only. Platform admins set it.", validators=[tenants.validators.validate_model_roots]),
        ),
        migrations.AlterField(
            model_name='release',
            name='weights_revision',
            field=models.CharField(blank=True, max_length=255, validators=[tenants.validators.validate_weights_revision]),
        ),
        migrations.RunPython(seed_roots, migrations.RunPython.noop),
    ]
