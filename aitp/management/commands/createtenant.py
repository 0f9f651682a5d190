from django.core.management.base import BaseCommand, CommandError

from aitp import tenancy
from tenants.models import Tenant


class Command(BaseCommand):
    help = "Create a tenant."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--name", default="")

    def handle(self, *args, slug, name, **options):
        if Tenant.objects.filter(slug=slug).exists():
            raise CommandError(f"tenant {slug!r} already exists")
        tenant = tenancy.tenant_create(slug=slug, name=name)
        self.stdout.write(f"created tenant {tenant.slug}")
