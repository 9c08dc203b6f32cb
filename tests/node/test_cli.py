"""The dpnode command line, run in process against a real database on each backend."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from dpnode.node.cli import main
from dpnode.node.context import NodeContext
from dpnode.node.services import datasets
from dpnode.node.settings import Settings, get_settings


@pytest.fixture
def cli_env(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, database_url: str
) -> Iterator[Settings]:
    monkeypatch.setenv("DPNODE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("DPNODE_DATABASE_URL", database_url)
    monkeypatch.setenv("DPNODE_ARGON2_MEMORY_KIB", "8192")
    monkeypatch.setenv("DPNODE_ARGON2_TIME_COST", "1")
    get_settings.cache_clear()
    yield get_settings()
    get_settings.cache_clear()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_migrate_and_users(cli_env: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "migrate", "--check")
    assert code == 0 and "database is up to date" in out
    code, out, _ = run(
        capsys,
        "user",
        "add",
        "--email",
        "Root@Example.org",
        "--role",
        "admin",
        "--password",
        "a long password",
    )
    assert code == 0 and out.startswith("created admin root@example.org")
    code, _, err = run(
        capsys,
        "user",
        "add",
        "--email",
        "root@example.org",
        "--role",
        "admin",
        "--password",
        "a long password",
    )
    assert code == 2 and "already exists" in err
    code, _, err = run(
        capsys, "user", "add", "--email", "x@example.org", "--role", "admin", "--password", "short"
    )
    assert code == 2 and "password too short" in err
    code, out, _ = run(capsys, "user", "list")
    assert "root@example.org" in out and "admin" in out


def test_unknown_role_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["user", "add", "--email", "a@b.org", "--role", "wizard", "--password", "x" * 10])
    assert exit_info.value.code == 2
    assert "invalid choice: 'wizard'" in capsys.readouterr().err


def test_a_number_argument_is_written_as_json_writes_one(
    cli_env: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    # int() and float() read '1_0' as 10, ' 5' as 5 and '٣' as 3: a grant of 10 for '1_0'
    grant = ("budget", "grant", "--user", "nobody@example.org", "--reason", "r", "--epsilon")
    for argv, option in (
        ((*grant, "1_0"), "--epsilon"),
        ((*grant, "1", "--delta", "+0.5"), "--delta"),
        (("ledger", "--limit", " 5"), "--limit"),
        (("audit", "--limit", "1e1"), "--limit"),
        (("policy", "show", "--revision", "٣"), "--revision"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(list(argv))
        assert exit_info.value.code == 2
        assert f"argument {option}: {argv[-1]!r} is not " in capsys.readouterr().err
    # as JSON (and str()) writes them; inf and nan are the service's to refuse, as before
    for epsilon, message in (("1e-1", "no user with email"), ("nan", "finite number")):
        code, _, err = run(capsys, *grant, epsilon)
        assert code == 2 and message in err, err
    assert run(capsys, "ledger", "--limit", "5") == (0, "", "")


def test_dataset_add_from_csv(
    cli_env: Settings, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    run(
        capsys,
        "user",
        "add",
        "--email",
        "owner@example.org",
        "--role",
        "data_owner",
        "--password",
        "a long password",
    )
    csv_file = tmp_path / "visits.csv"
    csv_file.write_text("patient_id,age,bmi,smoker\np1,34,22.5,no\np2,51,,yes\np1,35,131,no\n")
    bounds = tmp_path / "visits.toml"
    bounds.write_text(
        'subject_id = "patient_id"\nclamp = ["bmi"]\n[bounds]\nage = [0, 120]\nbmi = [10, 70]\n'
        '[categories]\nsmoker = ["no", "yes"]\n'
    )
    code, _, err = run(
        capsys,
        "dataset",
        "add",
        str(csv_file),
        "--name",
        "visits",
        "--bounds",
        str(bounds),
        "--owner",
        "owner@example.org",
    )
    assert code == 2
    assert "column 'bmi' has 1 NaN or infinite values" in err
    bounds.write_text(bounds.read_text() + "[fill]\nbmi = 25.0\n")
    code, out, err = run(
        capsys,
        "dataset",
        "add",
        str(csv_file),
        "--name",
        "visits",
        "--bounds",
        str(bounds),
        "--owner",
        "owner@example.org",
        "--tags",
        "health,Visits",
    )
    assert code == 0, err
    assert "added dataset 'visits' (id 1): 3 rows, 3 columns, owner owner@example.org" in out
    context = NodeContext.from_settings(cli_env)
    try:
        with context.sessions() as session:
            stored = datasets.get_dataset(session, "visits")
            assert [t.tag for t in stored.tags] == ["health", "visits"]
            assert (stored.subject_count, stored.max_rows_per_subject) == (2, 2)
            columns = datasets.read_columns(context.store, stored, mock=False)
    finally:
        context.close()
    np.testing.assert_array_equal(columns["age"], [34, 51, 35])
    np.testing.assert_array_equal(columns["bmi"], [22.5, 25.0, 70.0])  # filled, then clamped
    np.testing.assert_array_equal(columns["smoker"], [0, 1, 0])
    code, out, _ = run(capsys, "dataset", "list")
    assert "visits" in out and "3 rows" in out


def test_dataset_add_reports_bad_files(
    cli_env: Settings, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bounds = tmp_path / "b.toml"
    bounds.write_text("[bounds]\nage = [0, 120]\n[oops]\n")
    csv_file = tmp_path / "d.csv"
    csv_file.write_text("age\n1\n")
    code, _, err = run(
        capsys, "dataset", "add", str(csv_file), "--name", "d", "--bounds", str(bounds)
    )
    assert code == 2 and "unknown keys ['oops']" in err
    bounds.write_text("[bounds]\nage = [0, 120]\n")
    code, _, err = run(
        capsys,
        "dataset",
        "add",
        str(tmp_path / "missing.csv"),
        "--name",
        "d",
        "--bounds",
        str(bounds),
    )
    assert code == 2 and "cannot read" in err
    csv_file.write_text("age,bmi\n1\n")
    code, _, err = run(
        capsys, "dataset", "add", str(csv_file), "--name", "d", "--bounds", str(bounds)
    )
    assert code == 2 and "Expected 2 columns, got 1" in err
    csv_file.write_text("age\n1\n")
    code, _, err = run(
        capsys, "dataset", "add", str(csv_file), "--name", "d", "--bounds", str(bounds)
    )
    assert code == 2 and "no admin exists" in err


def test_production_refuses_placeholder_secret_and_demo(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setenv("DPNODE_ENVIRONMENT", "production")
    monkeypatch.setenv("DPNODE_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("DPNODE_TOKEN_SECRET", raising=False)
    get_settings.cache_clear()
    try:
        code, _, err = run(capsys, "migrate")
        assert code == 2 and "DPNODE_TOKEN_SECRET must be set" in err
        monkeypatch.setenv("DPNODE_TOKEN_SECRET", "s" * 40)
        get_settings.cache_clear()
        code, _, err = run(capsys, "serve", "--demo")
        assert code == 2 and "refused outside development" in err
    finally:
        get_settings.cache_clear()


def test_development_secret_is_random_and_kept(tmp_path: Path) -> None:
    first = NodeContext.from_settings(Settings(data_dir=tmp_path))
    second = NodeContext.from_settings(Settings(data_dir=tmp_path))
    other = NodeContext.from_settings(Settings(data_dir=tmp_path / "other"))
    secrets = [c.settings.token_secret.get_secret_value() for c in (first, second, other)]
    for c in (first, second, other):
        c.close()
    assert secrets[0] == secrets[1] != secrets[2]
    assert len(secrets[0]) >= 32 and secrets[0] != "change-me"
    assert (tmp_path / "token-secret").stat().st_mode & 0o077 == 0


def test_serve_refuses_several_workers_on_sqlite(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setenv("DPNODE_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("DPNODE_DATABASE_URL", raising=False)
    get_settings.cache_clear()
    try:
        code, _, err = run(capsys, "serve", "--workers", "2")
        assert code == 2 and "--workers > 1 needs PostgreSQL" in err
        code, _, err = run(capsys, "serve", "--workers", "0")
        assert code == 2 and "at least 1" in err
    finally:
        get_settings.cache_clear()
    assert not (tmp_path / "dpnode.sqlite3").exists()  # refused before migrating anything


def test_dataset_add_from_parquet_with_a_mock(
    cli_env: Settings, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    run(
        capsys, "user", "add", "--email", "a@example.org", "--role", "admin", "--password", "x" * 12
    )
    rng = np.random.default_rng(0)
    table = pa.table(
        {
            "score": rng.random(50_000).astype(np.float32),
            "visits": pa.array(rng.integers(0, 9, 50_000), pa.int16()),
            "site": pa.array(rng.choice(["a", "b"], 50_000)).dictionary_encode(),
        }
    )
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=7_000)
    pq.write_table(table.slice(0, 20), tmp_path / "mock.parquet")
    bounds = tmp_path / "b.toml"
    bounds.write_text(
        '[bounds]\nscore = [0, 1]\nvisits = [0, 8]\n[categories]\nsite = ["a", "b"]\n'
    )
    code, out, err = run(
        capsys, "dataset", "add", str(tmp_path / "t.parquet"), "--name", "p",
        "--bounds", str(bounds), "--mock", str(tmp_path / "mock.parquet"),
    )  # fmt: skip
    assert code == 0, err
    assert "50000 rows, 3 columns" in out
    context = NodeContext.from_settings(cli_env)
    try:
        with context.sessions() as session:
            stored = datasets.get_dataset(session, "p")
            assert [(c.name, c.dtype) for c in stored.columns] == [
                ("score", "float32"),
                ("visits", "int16"),
                ("site", "int64"),
            ]
            columns = datasets.read_columns(context.store, stored, mock=False)
            mock = datasets.read_columns(context.store, stored, mock=True)
    finally:
        context.close()
    np.testing.assert_array_equal(columns["score"], table.column("score").to_numpy())
    np.testing.assert_array_equal(columns["visits"], table.column("visits").to_numpy())
    sites = table.column("site").to_pylist()
    np.testing.assert_array_equal(columns["site"], [0 if s == "a" else 1 for s in sites])
    assert len(mock["score"]) == 20
    assert not any(cli_env.upload_dir.iterdir())  # the session's files are gone


@pytest.mark.parametrize(
    ("variable", "value", "module", "extra"),
    [
        ("DPNODE_DASK_SCHEDULER", "tcp://10.0.0.5:8786", "distributed", "dask"),
        ("DPNODE_BLOB_STORE", "s3", "minio", "s3"),
        ("DPNODE_DATABASE_URL", "postgresql+psycopg://db/dpnode", "psycopg", "postgres"),
    ],
)
def test_a_setting_whose_package_is_missing_names_the_extra_at_start(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    variable: str,
    value: str,
    module: str,
    extra: str,
) -> None:
    """A node installed without an extra its settings need says so when it starts (exit 2,
    the pip command), not with a 500 on the first publish that needs it."""
    monkeypatch.setenv("DPNODE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("DPNODE_S3_ENDPOINT", "127.0.0.1:9000")
    monkeypatch.setenv(variable, value)
    monkeypatch.setitem(sys.modules, module, None)  # the import system's "not installed"
    get_settings.cache_clear()
    try:
        code, _, err = run(capsys, "serve")
    finally:
        get_settings.cache_clear()
    assert code == 2 and "invalid configuration" in err
    assert f"needs the {module!r} package" in err and f"pip install 'dpnode[{extra}]'" in err
    assert not (tmp_path / "dpnode.sqlite3").exists()
