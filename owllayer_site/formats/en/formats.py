"""The English formats Django would use, replaced by the site's own (set in
settings: DATE_FORMAT, DATETIME_FORMAT, ...). Django reads a language's
format module before the settings, so without this one its own English
formats ("Dec. 3, 2026, 2:05 p.m.") would win."""
from django.conf import settings

DATE_FORMAT = settings.DATE_FORMAT
DATETIME_FORMAT = settings.DATETIME_FORMAT
TIME_FORMAT = settings.TIME_FORMAT
SHORT_DATE_FORMAT = settings.SHORT_DATE_FORMAT
SHORT_DATETIME_FORMAT = settings.SHORT_DATETIME_FORMAT
YEAR_MONTH_FORMAT = settings.YEAR_MONTH_FORMAT
MONTH_DAY_FORMAT = settings.MONTH_DAY_FORMAT
