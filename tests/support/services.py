"""Do the PostgreSQL and Redis of the second test pass answer?

``python -m tests.support.services POSTGRES_URL REDIS_URL`` prints one line
per service and exits 0 only when both answer within a short timeout.
"""
from __future__ import annotations

import sys

TIMEOUT_SECONDS = 3


def postgres_problem(url: str) -> str | None:
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=TIMEOUT_SECONDS) as connection:
            connection.execute("select 1")
    except psycopg.Error as exc:
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return None


def redis_problem(url: str) -> str | None:
    import redis

    client = redis.Redis.from_url(
        url, socket_connect_timeout=TIMEOUT_SECONDS, socket_timeout=TIMEOUT_SECONDS
    )
    try:
        client.ping()
    except redis.RedisError as exc:
        return str(exc) or type(exc).__name__
    finally:
        client.close()
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m tests.support.services POSTGRES_URL REDIS_URL", file=sys.stderr)
        return 2
    postgres_url, redis_url = argv
    problems = {
        "postgresql": postgres_problem(postgres_url),
        "redis": redis_problem(redis_url),
    }
    for name, problem in problems.items():
        print(f"{name}: {'answers' if problem is None else 'does not answer: ' + problem}")
    return 0 if all(problem is None for problem in problems.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
