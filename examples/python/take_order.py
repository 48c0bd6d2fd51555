#!/usr/bin/env python3
"""Take an order and enqueue its delivery in the same transaction, from Python.

The shop writes its own row (an order) and leasehold's outbox rows (the attempt that
delivers it) in one transaction: both commit, or neither exists. `leasehold_enqueue`
is installed in the ledger's database by `leasehold migrate`; it checks the input
against the plan's `[input]` table, resolves the step payloads and writes the
attempt, its receipts and its command exactly as the Rust outbox does. Workers
(`leasehold worker`) deliver the command once the transaction commits.

The enqueue key makes the call safe to retry: the same order enqueued again (a
retried request, a crashed web handler) answers the attempt it already has.

    take_order.py --postgres postgresql://postgres@127.0.0.1:5432/shop \\
        --plan pln-... --order o-1 --total-cents 4200
    take_order.py --mysql mysql://root@127.0.0.1:3306/shop --plan pln-... --order o-1 --total-cents 4200

It prints one JSON line: the order, the attempt and whether this call created it
(`false`: the order was enqueued before, and nothing was written now). With
`--rollback` the transaction is rolled back instead: neither the order nor its
attempt remains. Needs psycopg 3 (Debian: python3-psycopg) for PostgreSQL and
PyMySQL (python3-pymysql) for MySQL / MariaDB.
"""

import argparse
import json
import sys
from urllib.parse import unquote, urlparse

ORDERS_POSTGRES = "CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, total_cents BIGINT NOT NULL)"
ORDERS_MYSQL = (
    "CREATE TABLE IF NOT EXISTS orders (id VARCHAR(64) PRIMARY KEY, total_cents BIGINT NOT NULL) ENGINE = InnoDB"
)


def order_input(order, total_cents):
    """The template's input: what its step payloads refer to with {"$input": ...}."""
    return json.dumps({"order": order, "total_cents": total_cents})


def take_order_postgres(dsn, plan, order, total_cents, rollback):
    import psycopg

    with psycopg.connect(dsn) as conn:
        with conn.cursor() as cur:
            cur.execute(ORDERS_POSTGRES)
        conn.commit()
        with conn.cursor() as cur:
            cur.execute(
                "INSERT INTO orders (id, total_cents) VALUES (%s, %s) ON CONFLICT (id) DO NOTHING",
                (order, total_cents),
            )
            cur.execute(
                "SELECT attempt_id, created FROM leasehold_enqueue(%s, %s::json, order_key => %s, enqueue_key => %s)",
                (plan, order_input(order, total_cents), order, "order-" + order),
            )
            attempt_id, created = cur.fetchone()
        if rollback:
            conn.rollback()
        else:
            conn.commit()
    return attempt_id, created


def take_order_mysql(url, plan, order, total_cents, rollback):
    import pymysql

    u = urlparse(url)
    conn = pymysql.connect(
        host=u.hostname or "127.0.0.1",
        port=u.port or 3306,
        user=unquote(u.username or "root"),
        password=unquote(u.password or ""),
        database=u.path.lstrip("/"),
        autocommit=False,
    )
    try:
        with conn.cursor() as cur:
            cur.execute(ORDERS_MYSQL)
            conn.begin()
            cur.execute("INSERT IGNORE INTO orders (id, total_cents) VALUES (%s, %s)", (order, total_cents))
            cur.execute(
                "CALL leasehold_enqueue(%s, %s, %s, %s, NULL, @attempt_id, @created)",
                (plan, order_input(order, total_cents), order, "order-" + order),
            )
            cur.execute("SELECT @attempt_id, @created")
            attempt_id, created = cur.fetchone()
        if rollback:
            conn.rollback()
        else:
            conn.commit()
    finally:
        conn.close()
    return attempt_id, bool(created)


def main():
    parser = argparse.ArgumentParser(description="Take an order and enqueue its delivery in one transaction.")
    db = parser.add_mutually_exclusive_group(required=True)
    db.add_argument("--postgres", metavar="DSN", help="the ledger's PostgreSQL database (libpq URL)")
    db.add_argument("--mysql", metavar="URL", help="the ledger's MySQL / MariaDB database, mysql://user[:pw]@host:port/db")
    parser.add_argument("--plan", required=True, help="the template's plan id (leasehold plan register)")
    parser.add_argument("--order", required=True, help="the order's id, also its order key and enqueue key")
    parser.add_argument("--total-cents", type=int, required=True)
    parser.add_argument("--rollback", action="store_true", help="roll the transaction back instead of committing")
    args = parser.parse_args()
    take = take_order_postgres if args.postgres else take_order_mysql
    try:
        attempt_id, created = take(args.postgres or args.mysql, args.plan, args.order, args.total_cents, args.rollback)
    except Exception as e:  # the database's refusal names the field and the reason
        print(f"take_order: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"order": args.order, "attempt_id": attempt_id, "created": bool(created), "committed": not args.rollback}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
