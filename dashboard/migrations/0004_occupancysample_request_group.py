"""Rename ``OccupancySample.salt_group`` to ``request_group`` (the one name of the idea); rows are kept."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('dashboard', '0003_message_rejection_per_node'),
    ]

    operations = [
        migrations.RenameField(
            model_name='occupancysample',
            old_name='salt_group',
            new_name='request_group',
        ),
    ]
