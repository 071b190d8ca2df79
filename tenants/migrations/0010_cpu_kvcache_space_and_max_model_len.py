"""Launch settings a real vLLM CPU node needs: ``Node.cpu_kvcache_space_gib`` (``VLLM_CPU_KVCACHE_SPACE``, was a
fixed 1 GiB) and ``Release.max_model_len`` (``--max-model-len`` / SGLang ``--context-length``; not in the
fingerprint)."""

import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('tenants', '0009_platform_quota_confirmations'),
    ]

    operations = [
        migrations.AddField(
            model_name='node',
            name='cpu_kvcache_space_gib',
            field=models.PositiveIntegerField(default=1, help_text='device=cpu nodes: GiB of KV cache each vLLM instance allocates in host memory (VLLM_CPU_KVCACHE_SPACE), 1 to 65536; ignored on cuda nodes.', validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(65536)]),
        ),
        migrations.AddField(
            model_name='release',
            name='max_model_len',
            field=models.PositiveIntegerField(blank=True, help_text="Longest context (prompt + output tokens) an instance serves, 1 to 2147483647: vLLM --max-model-len, SGLang --context-length; blank = the model's own. Not part of the fingerprint (it changes no block hash).", null=True, validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(2147483647)]),
        ),
    ]
