from django.core.management.base import BaseCommand, CommandError

from aitp import tenancy
from tenants.models import Tenant


class Command(BaseCommand):
    help = "Create a publishable API key; the key is printed alone on the last line, once."

    def add_arguments(self, parser):
        parser.add_argument("--tenant", required=True, help="tenant slug")
        parser.add_argument("--name", default="")
        parser.add_argument(
            "--origin", action="append", default=[], dest="origins",
            help="allowed Origin (repeat); none means any origin",
        )
        parser.add_argument("--max-sessions", type=int, default=None)

    def handle(self, *args, tenant, name, origins, max_sessions, **options):
        row = Tenant.objects.filter(slug=tenant).first()
        if row is None:
            raise CommandError(f"no tenant {tenant!r}")
        if max_sessions is not None and max_sessions < 1:
            raise CommandError("--max-sessions must be at least 1")
        try:
            key, raw = tenancy.key_create(
                tenant=row, name=name, allowed_origins=origins, max_sessions=max_sessions
            )
        except tenancy.KeyCeilingReached as refused:
            raise CommandError(f"no key created for tenant {row.slug}: {refused}") from None
        self.stdout.write(
            f"created key {key.prefix}… for tenant {row.slug} "
            f"(origins: {', '.join(key.allowed_origins) or 'any'}; max sessions {key.max_sessions})"
        )
        self.stdout.write(raw)
