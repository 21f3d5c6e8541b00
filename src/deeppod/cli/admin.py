"""Accounts and the cluster: login, whoami, tenants, users, tokens, nodes."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from deeppod.cli import aws_profile as aws_profiles
from deeppod.cli.common import JsonOpt, TokenOpt, UrlOpt, client
from deeppod.cli.output import burst_tables, console, nodes_table, print_json, rows_table
from deeppod.cli.values import parse_age
from deeppod.contract import server_urls
from deeppod.errors import InvalidRequest
from deeppod.settings import ClientSettings, client_config_path

app = typer.Typer()
tenants_app = typer.Typer(no_args_is_help=True, help="Tenants (admins).")
users_app = typer.Typer(no_args_is_help=True, help="Users (admins create them).")
tokens_app = typer.Typer(no_args_is_help=True, help="API tokens.")
keys_app = typer.Typer(no_args_is_help=True, help="S3 access keys (the S3 endpoint at /s3: docs/datasets.md).")
nodes_app = typer.Typer(help="Nodes and GPUs: list, cordon, uncordon.", invoke_without_command=True)
app.add_typer(tenants_app, name="tenants")
app.add_typer(users_app, name="users")
app.add_typer(tokens_app, name="tokens")
app.add_typer(keys_app, name="keys")
app.add_typer(nodes_app, name="nodes")


@app.command()
def login(server: Annotated[str | None, typer.Argument(
              metavar="URL", help="server URL, or several comma-separated (a failover control plane)",
              show_default=False)] = None,
          url: Annotated[str | None, typer.Option("--url", help="the same as URL", show_default=False)] = None,
          token: Annotated[str | None, typer.Option(
              help="API token (not needed for a server of yours on this machine: its admin token is read "
                   "from its home)", show_default=False)] = None,
          ca_cert: Annotated[Path | None, typer.Option(
              help="an https server's CA file, when its certificate is self-signed or from a private CA "
                   "(the server prints where it is)")] = None) -> None:
    """Check a URL and token and save them: later commands use this server by default."""
    url = server or url
    if not url:
        raise InvalidRequest("name the server: 'deeppod login URL' (e.g. http://127.0.0.1:7447)")
    ca = str(ca_cert.expanduser().resolve()) if ca_cert else None
    if ca and not os.path.isfile(ca):
        raise InvalidRequest(f"--ca-cert {ca_cert}: no such file; copy the server's ca.pem here first")
    c = client(url, token, ca)
    me = c.whoami()
    path = client_config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"url": ",".join(server_urls(url)), "token": c.token,
                   **({"ca_cert": c.ca_cert} if c.ca_cert else {})}, f)
    console.print(f"logged in to {url} as {me['user']} (tenant {me['tenant']}, {me.get('role', 'member')}); "
                  f"saved to {path}")


@app.command()
def whoami(url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Who the token belongs to, on which server, and where the server lets your jobs work."""
    c = client(url, token)
    me = c.whoami()
    console.print(f"{me['user']} (tenant {me['tenant']}, {me.get('role', 'member')}) at {c.url}", soft_wrap=True)
    if me.get("isolation"):
        roots = me.get("work_roots")
        where = (f"; jobs work under {', '.join(roots)} or in the code sent with them" if roots is not None
                 else "; jobs run as the server's OS identity")
        console.print(f"isolation: {me['isolation']}{where}")


@app.command()
def servers(as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """The servers of the control plane (several on one PostgreSQL: a failover control plane),
    and which one leads."""
    rows = client(url, token).servers()
    if as_json:
        print_json(rows)
        return
    for r in rows:
        r["role"] = "leader" if r["leader"] else ("standby" if r["live"] else "gone")
        r["seen"] = f"{r['seen_s_ago']:g} s ago"
    console.print(rows_table(rows, ["url", "role", "epoch", "host", "pid", "seen"]))


@nodes_app.callback()
def nodes(ctx: typer.Context, as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Nodes and their GPUs (cordoned GPUs are listed as sick)."""
    if ctx.invoked_subcommand:
        return
    c = client(url, token)
    rows = c.nodes()
    if as_json:
        print_json(rows)
        return
    console.print(nodes_table(rows))
    for table in burst_tables(c.nodes.burst()):  # when the plan has burst types, or tenants were charged for them
        console.print(table)


@nodes_app.command("burst")
def nodes_burst(as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Burst node types (nodes up, asked for, and why) and each tenant's burst cost and budget."""
    shown = client(url, token).nodes.burst()
    if as_json:
        print_json(shown)
        return
    tables = burst_tables(shown)
    for table in tables:
        console.print(table)
    if not tables:
        console.print("the plan has no burst types, and no tenant was charged for burst nodes")


@nodes_app.command("cordon")
def nodes_cordon(name: str, gpu: Annotated[int | None, typer.Option(help="only this GPU")] = None,
                 url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Mark a node or GPU unhealthy: its jobs requeue elsewhere, nothing new lands there."""
    client(url, token).nodes.set_health(name, False, gpu)
    console.print(f"cordoned {name}" + (f" GPU {gpu}" if gpu is not None else ""))


@nodes_app.command("uncordon")
def nodes_uncordon(name: str, gpu: Annotated[int | None, typer.Option(help="only this GPU")] = None,
                   url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Put a node or GPU back in service."""
    client(url, token).nodes.set_health(name, True, gpu)
    console.print(f"uncordoned {name}" + (f" GPU {gpu}" if gpu is not None else ""))


@tenants_app.command("create")
def tenants_create(name: str, url: UrlOpt = None, token: TokenOpt = None) -> None:
    t = client(url, token).tenants.create(name)
    console.print(f"tenant {t['name']} created")


@tenants_app.command("ls")
def tenants_ls(as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    rows = client(url, token).tenants()
    print_json(rows) if as_json else console.print(rows_table(rows, ["id", "name", "created_at"]))


@users_app.command("create")
def users_create(name: str, tenant: Annotated[str, typer.Option(help="the user's tenant")],
                 role: Annotated[str, typer.Option(help="admin, tenant-admin, member or viewer")] = "member",
                 admin: Annotated[bool, typer.Option("--admin", help="the same as --role admin")] = False,
                 url: UrlOpt = None, token: TokenOpt = None) -> None:
    """A user and its first token. tenant-admin: manages its tenant's users and tokens and the plan
    below its tenant; member: submits and manages its own jobs; viewer: reads only."""
    u = client(url, token).users.create(name, tenant, admin, role)
    console.print(f"user {u['name']} created in tenant {u['tenant']} (role {u['role']})")
    console.print(f"token (shown once): {u['token']}")


@users_app.command("set-role")
def users_set_role(name: str, role: Annotated[str, typer.Argument(help="admin, tenant-admin, member or viewer")],
                   url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Change a user's role (it holds from the user's next call)."""
    u = client(url, token).users.set_role(name, role)
    console.print(f"user {u['name']} (tenant {u['tenant']}) is now {u['role']}")


@users_app.command("ls")
def users_ls(as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    rows = client(url, token).users()
    print_json(rows) if as_json else console.print(rows_table(rows, ["id", "name", "tenant", "role"]))


@tokens_app.command("current")
def tokens_current(url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Print the token this CLI uses (for scripts: curl -H "Authorization: Bearer $(deeppod tokens current)")."""
    found = ClientSettings.resolve(url, token).token
    if not found:
        raise InvalidRequest("no token: log in with 'deeppod login --url URL --token TOKEN' or set DEEPPOD_TOKEN")
    sys.stdout.write(found + "\n")


@tokens_app.command("create")
def tokens_create(name: Annotated[str, typer.Option(help="a label to recognise it by")] = "",
                  user: Annotated[str | None, typer.Option(help="admins, tenant admins: for this user")] = None,
                  scope: Annotated[str, typer.Option(help="all (what the role allows), read (GET only) "
                                                          "or predict (predictions only)")] = "all",
                  expires: Annotated[str | None, typer.Option(help="stops working after this long: "
                                                                      "90m, 12h, 30d (default: until revoked)")] = None,
                  url: UrlOpt = None, token: TokenOpt = None) -> None:
    """A new token: scoped and expiring if you say so (revoke it any time: 'deeppod tokens revoke ID')."""
    t = client(url, token).tokens.create(name, user, scope, parse_age(expires, "--expires") if expires else None)
    until = f", expires {t['expires_at']}" if t.get("expires_at") else ""
    console.print(f"token {t['id']} for {t['user']} (scope {t['scope']}{until}; shown once): {t['token']}")


@tokens_app.command("ls")
def tokens_ls(as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    rows = client(url, token).tokens()
    print_json(rows) if as_json else console.print(rows_table(rows, ["id", "name", "scope", "created_at",
                                                                     "expires_at"]))


@tokens_app.command("revoke")
def tokens_revoke(token_id: int, url: UrlOpt = None, token: TokenOpt = None) -> None:
    client(url, token).tokens.revoke(token_id)
    console.print(f"token {token_id} revoked")


@keys_app.command("create")
def keys_create(name: Annotated[str, typer.Option(help="a label to recognise it by")] = "",
                scope: Annotated[str, typer.Option(help="read (GET, HEAD, LIST) or write (also PUT and DELETE "
                                                        "in inboxes)")] = "write",
                expires: Annotated[str | None, typer.Option(help="stops working after this long: 12h, 30d "
                                                                    "(default: until revoked)")] = None,
                aws_profile: Annotated[str | None, typer.Option(
                    help="also write it as this AWS profile (~/.aws, or $AWS_SHARED_CREDENTIALS_FILE and "
                         "$AWS_CONFIG_FILE), endpoint included: then 'aws --profile NAME s3 ls'")] = None,
                as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """A new S3 access key for you; its secret is shown once. Give both to any S3 client with the
    endpoint printed (path-style), or let --aws-profile write them where the AWS tools look."""
    if aws_profile is not None:
        aws_profiles.check_free(aws_profile)  # before the key is made: a refusal leaves nothing behind
    k = client(url, token).create_access_key(name, scope, parse_age(expires, "--expires") if expires else None)
    written = aws_profiles.write(aws_profile, k["key_id"], k["secret"], k["endpoint"]) if aws_profile else None
    if as_json:
        return print_json(k)
    until = f", expires {k['expires_at']}" if k.get("expires_at") else ""
    console.print(f"access key {k['key_id']} (scope {k['scope']}{until})\n"
                  f"secret (shown once): {k['secret']}\nendpoint: {k['endpoint']}", soft_wrap=True)
    if written:
        console.print(f"written as AWS profile {aws_profile!r} ({written[0]}, {written[1]}): "
                      f"aws --profile {aws_profile} s3 ls s3://datasets/", soft_wrap=True)
    else:
        console.print(f"e.g.: AWS_ACCESS_KEY_ID={k['key_id']} AWS_SECRET_ACCESS_KEY=... "
                      f"aws --endpoint-url {k['endpoint']} s3 ls s3://datasets/", soft_wrap=True)


@keys_app.command("ls")
def keys_ls(as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    rows = client(url, token).access_keys()
    print_json(rows) if as_json else console.print(rows_table(rows, ["key_id", "name", "scope", "created_at",
                                                                     "expires_at", "revoked_at"]))


@keys_app.command("revoke")
def keys_revoke(key_id: str, url: UrlOpt = None, token: TokenOpt = None) -> None:
    client(url, token).revoke_access_key(key_id)
    console.print(f"access key {key_id} revoked")
