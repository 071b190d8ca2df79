"""LoRA adapters become objects ``{"name", "path"}``: each stored name-only adapter is kept as
``{"name": <name>, "path": null}``.

Before this migration a release held adapter names only. Nothing says where such an adapter was loaded from,
so no path is invented: ``path`` is ``null``, which the registry reads as "recorded before paths were required"
(``Release.adapters_without_path``). Such an adapter stays valid while it is unchanged, keeps the release's
fingerprint exactly as it was (``tenants.fingerprint.canonical_adapters`` encodes it as the bare name, as
before) and is left out of the rendered launch lines; a new adapter needs a path.

Rows are rewritten with ``UPDATE`` only where an entry changes, so ``updated_at`` and ``fingerprint`` stay as
they were. Going back turns path-less objects into names again and refuses (naming the releases) while any
adapter has a path, which the old schema could not hold.
"""
from django.db import migrations, models

import tenants.validators


def _forward_entry(entry):
    if isinstance(entry, str):
        return {"name": entry, "path": None}
    return entry


def names_to_objects(apps, schema_editor):
    Release = apps.get_model("tenants", "Release")
    for pk, adapters in Release.objects.values_list("pk", "adapters"):
        if not isinstance(adapters, list):
            continue
        converted = [_forward_entry(entry) for entry in adapters]
        if converted != adapters:
            Release.objects.filter(pk=pk).update(adapters=converted)


def objects_to_names(apps, schema_editor):
    Release = apps.get_model("tenants", "Release")
    with_paths = []
    updates = {}
    for pk, namespace, adapters in Release.objects.values_list("pk", "namespace", "adapters"):
        if not isinstance(adapters, list):
            continue
        converted = []
        for entry in adapters:
            if isinstance(entry, dict) and entry.get("path") is None and set(entry) <= {"name", "path"}:
                converted.append(entry.get("name"))
            elif isinstance(entry, dict):
                with_paths.append(f"{namespace} (id {pk})")
                break
            else:
                converted.append(entry)
        else:
            if converted != adapters:
                updates[pk] = converted
    if with_paths:
        raise RuntimeError(
            "Cannot go back before tenants 0005: these releases have LoRA adapters with a path or rank, which "
            f"the name-only schema cannot hold: {', '.join(sorted(set(with_paths)))}."
        )
    for pk, converted in updates.items():
        Release.objects.filter(pk=pk).update(adapters=converted)


class Migration(migrations.Migration):

    dependencies = [
        ("tenants", "0004_kv_dtype_choices"),
    ]

    operations = [
        migrations.AlterField(
            model_name="release",
            name="adapters",
            field=models.JSONField(
                blank=True,
                default=list,
                help_text='LoRA adapters: [{"name": "sql-lora", "path": "/adapters/sql-v1" or "org/sql-lora", '
                '"rank": 16 (optional)}].',
                validators=[tenants.validators.validate_adapters],
            ),
        ),
        migrations.RunPython(names_to_objects, objects_to_names),
    ]
