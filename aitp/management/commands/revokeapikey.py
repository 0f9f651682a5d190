from django.core.management.base import BaseCommand, CommandError

from aitp import tenancy
from aitp.models import ApiKey
from aitp.store.keys import LOOKUP_PREFIX_LENGTH


class Command(BaseCommand):
    help = "Revoke an API key by its prefix; its live sessions close (1008) on every process."

    def add_arguments(self, parser):
        parser.add_argument("prefix", help="the key's lookup prefix (or the whole key)")

    def handle(self, *args, prefix, **options):
        prefix = prefix.rstrip("…")[:LOOKUP_PREFIX_LENGTH]
        key = ApiKey.objects.filter(prefix=prefix).first()
        if key is None:
            raise CommandError(f"no key with prefix {prefix!r}")
        if key.status == ApiKey.Status.REVOKED:
            self.stdout.write(f"key {key.prefix}… was already revoked")
            return
        tenancy.key_revoke(key=key)
        self.stdout.write(f"revoked key {key.prefix}…")
