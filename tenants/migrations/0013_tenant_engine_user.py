"""``Tenant.engine_user``: the node account a tenant's engine instances run as (``LaunchSpec.user``; blank =
``kvpool-t<pk>``), unique among tenants that set one."""

import django.db.models
from django.db import migrations, models

import tenants.validators


class Migration(migrations.Migration):

    dependencies = [
        ('tenants', '0012_model_roots_and_argv_values'),
    ]

    operations = [
        migrations.AddField(
            model_name='tenant',
            name='engine_user',
            field=models.CharField(blank=True, default='', help_text='Node account the tenant\'s engine instances run as (a POSIX user name); blank = kvpool-t<id>.', max_length=32, validators=[tenants.validators.validate_engine_user]),
        ),
        migrations.AddConstraint(
            model_name='tenant',
            constraint=models.UniqueConstraint(condition=django.db.models.Q(('engine_user', ''), _negated=True), fields=('engine_user',), name='uniq_tenant_engine_user', violation_error_message='This engine_user is not available.'),
        ),
    ]
