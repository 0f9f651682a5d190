"""Names used where vulture cannot look, for `make lint`'s dead-code check.

vulture reads Python only, and reports a name nothing in Python reads. Django,
Channels, pydantic, the SDKs and the templates read the names below by
convention or by name, so each is listed here once: a name listed counts as
used everywhere. List only what something outside the Python reads (say what
in the comment above the group); code that nothing reads is deleted instead.
"""


class _Names:
    """Every attribute is None: the module runs, and each line below is a use."""

    def __getattr__(self, name: str) -> None:
        return None


_ = _Names()

# Django's settings (owllayer_site/settings.py), read by Django and its apps.
(_.ALLOWED_HOSTS, _.INSTALLED_APPS, _.MIDDLEWARE, _.ROOT_URLCONF, _.ASGI_APPLICATION, _.TEMPLATES,
 _.DEFAULT_AUTO_FIELD, _.AUTH_PASSWORD_VALIDATORS, _.AUTHENTICATION_BACKENDS, _.LANGUAGE_CODE,
 _.TIME_ZONE, _.USE_I18N, _.USE_TZ, _.FORMAT_MODULE_PATH, _.STATIC_URL, _.STATIC_ROOT,
 _.STATICFILES_DIRS, _.WHITENOISE_USE_FINDERS, _.LOGIN_URL, _.LOGIN_REDIRECT_URL, _.LOGGING,
 _.SECURE_SSL_REDIRECT, _.SESSION_COOKIE_SECURE, _.CSRF_COOKIE_SECURE,
 _.SECURE_HSTS_SECONDS, _.SECURE_HSTS_INCLUDE_SUBDOMAINS, _.SECURE_HSTS_PRELOAD,
 _.SECURE_PROXY_SSL_HEADER, _.SESSION_COOKIE_HTTPONLY, _.CONTENT_SECURITY_POLICY,
 _.EMAIL_BACKEND, _.EMAIL_HOST, _.EMAIL_PORT, _.EMAIL_HOST_USER, _.EMAIL_HOST_PASSWORD,
 _.EMAIL_TIMEOUT, _.DEFAULT_FROM_EMAIL)
# django-axes' settings.
(_.AXES_ENABLED, _.AXES_HANDLER, _.AXES_LOCKOUT_CALLABLE, _.AXES_LOCKOUT_PARAMETERS,
 _.AXES_COOLOFF_TIME, _.AXES_RESET_ON_SUCCESS, _.AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT)

# Django by convention: app configs, URLconfs, the ASGI entry point,
# management commands, model Meta options, form hooks.
(_.AitpConfig, _.ApprovalsConfig, _.DemoConfig, _.OperatorsConfig, _.TenantsConfig,
 _.verbose_name, _.default_auto_field)
(_.urlpatterns, _.app_name, _.application)
(_.Command, _.help, _.add_arguments)
(_.verbose_name_plural, _.constraints, _.default_permissions)
# Form fields read by their name (cleaned_data, the posted data, the templates).
(_.budget_usd, _.greeting, _.accent, _.language)
# A form field's flag that Django's forms read (a viewer's read-only form).
(_.disabled,)
(_.widget, _.clean_user, _.clean_allowed_origins, _.clean_expires_at, _.clean_status, _.clean_tenant, _.clean_arguments)
# The admin's options and hooks (methods shown in lists are @admin.display,
# which vulture is told to skip).
(_.list_display, _.list_display_links, _.list_filter, _.list_select_related, _.search_fields,
 _.date_hierarchy, _.readonly_fields, _.autocomplete_fields, _.inlines, _.can_delete)
(_.has_module_permission, _.has_view_permission, _.change_view, _.form_url, _.save_model,
 _.delete_model, _.delete_queryset, _.lookups, _.field_choices)
# Refused on the audit log's manager: no bulk write bypasses the chain.
(_.bulk_update,)

# Columns and choices that the database, the admin and the templates read.
(_.updated_at, _.max_keys, _.token_hash, _.accepted_by, _.decided_at, _.user_decided_at,
 _.operator_note, _.operator_decided_at, _.review_note, _.reviewed_by,
 _.reviewed_at, _.resumes, _.sockets)
(_.ASSISTANT, _.ADMIN, _.CONSOLE)

# Read by templates: the voice columns, a cut answer's note, a product's
# drawing, the lockout page, the usage chart.
(_.audio_heard_seconds, _.audio_spoken_seconds, _.cut_note, _.picture)
(_.whole_address, _.lasts, _.ends_at)
(_.x, _.y, _.plot_top, _.max_value, _.first_label, _.last_label)

# pydantic: a model's configuration, and fields only serialized onto the wire.
(_.model_config, _.sessionId, _.serverVersion, _.maxActiveTools, _.resumeToken)

# Channels: the socket's disconnect, and handlers named by the message type
# they receive ("watch.ready" -> watch_ready).
(_.websocket_disconnect, _.watch_ready, _.watch_event, _.watch_access, _.watch_frame,
 _.relay_outbound, _.relay_close)
# channels_redis' layer: attributes it reads, replaced.
(_.receive_clean_locks, _.brpop_timeout)

# A turn's record: written by statement (aitp.store.statements.TURN_COLUMNS) and shown by templates.
(_.ANSWERED, _.first_text_ms, _.model_ms, _.tools_ms, _.approval_ms)

# Named by a dotted path in the settings, or by name in an engine table.
(_.ResilientRedisChannelLayer, _.LoginThrottlingHandler, _.lockout_response, _.probes)
(_.JsonFormatter, _.SessionFields, _.model_access_problem)
(_.AnthropicBackend, _.DemoBackend, _.OfflineBackend)

# Hooks of libraries: the Anthropic SDK's middleware, autobahn's protocol
# attributes, and parameters a signature we implement must take.
(_.handle_async, _.failByDrop, _.__str__, _.default_schema, _.field_title_should_be_set,
 _.nullable_schema)
(_.signum,)
# The standard library's HTTP server: its handler's methods and its attributes (runtime.metrics_server).
(_.do_GET, _.do_POST, _.log_message, _.daemon_threads, _.address_family, _.allow_reuse_port)
# prometheus_client reads its values' class from its module (runtime.metrics sets it).
(_.ValueClass,)

# The Python client's API for its users (aitp_client).
(_.wait_closed, _.recv_until, _.say, _.next_resume)

# What the tests observe or reset through: the audit chain's check, the
# anchorer, the speech jobs and engines, the shared model client, the
# server-frame parser, the Django state of a row written by statement.
(_.verify_chain, _.wait_until_anchored, _.reset, _.jobs_of, _.transcribe_now,
 _.speech_end_seconds, _.close_client, _.db, _.frame_schema, _.to_wire)
# The in-memory exporter tests read a turn's spans from (runtime.tracing).
(_.record_in_memory,)
# Written for the tests beside the fast session writes.
(_.tool_calls_record, _.USAGE_FIELDS)
# autobahn reads what a dropped connection was like from these (owllayer_site.daphne_close).
(_.closeHandshakeTimeoutCall, _.wasClean, _.wasNotCleanReason, _.wasCloseHandshakeTimeout)
