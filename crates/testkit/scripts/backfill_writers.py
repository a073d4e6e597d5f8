"""Writers during a new view's backfill (docs/benchmarks.md): how long a single-row INSERT
takes while CREATE MATERIALIZED VIEW backfills a 200 000-group aggregate over a large table,
and the server's peak RSS. Not yet a `bin/bench` mode; run with the clients venv bin/test makes:
  ~/.cache/eddy/clients-venv/bin/python crates/testkit/scripts/backfill_writers.py \
      target/release/eddy ROWS [ROWS_PER_COMMIT]"""
import os, shutil, socket, subprocess, sys, tempfile, threading, time
import psycopg

binary, rows = sys.argv[1], int(sys.argv[2])

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

data = tempfile.mkdtemp(prefix="bf-")
pg, http = free_port(), free_port()
server = subprocess.Popen([binary, "--data-dir", os.path.join(data, "d"), "--listen", f"127.0.0.1:{pg}",
                           "--http-listen", f"127.0.0.1:{http}", "--checkpoint-interval", "0"],
                          stdout=subprocess.DEVNULL, stderr=open(os.path.join(data, "log"), "w"))
dsn = f"host=127.0.0.1 port={pg} user=eddy dbname=eddy"
for _ in range(300):
    try:
        psycopg.connect(dsn, autocommit=True).close(); break
    except Exception:
        time.sleep(0.1)
c = psycopg.connect(dsn, autocommit=True)
c.execute("CREATE TABLE t (id BIGINT, v BIGINT) APPEND ONLY")
step = int(sys.argv[3]) if len(sys.argv) > 3 else 100_000
for lo in range(0, rows, step):
    c.execute(f"INSERT INTO t SELECT g, g % 97 FROM generate_series({lo}, {lo + step - 1}) AS s(g)")
c.execute("FLUSH")
latencies, stop = [], threading.Event()
def writer():
    w = psycopg.connect(dsn, autocommit=True)
    i = rows
    while not stop.is_set():
        t0 = time.perf_counter()
        w.execute("INSERT INTO t VALUES (%s, 1)", (i,))
        latencies.append((t0, time.perf_counter() - t0))
        i += 1
        time.sleep(0.005)
th = threading.Thread(target=writer); th.start()
time.sleep(1.0)
t0 = time.perf_counter()
c.execute("CREATE MATERIALIZED VIEW v AS SELECT id % 200000 AS k, count(*) AS n, sum(v) AS s FROM t GROUP BY 1")
create = time.perf_counter() - t0
t1 = time.perf_counter()
time.sleep(0.5)
stop.set(); th.join()
# Every write started while CREATE ran, the one it held included.
during = [l for (start, l) in latencies if t0 <= start <= t1]
worst = max((l, start - t0) for (start, l) in latencies if t0 <= start <= t1)
print(f"worst write started {worst[1]:.2f} s into CREATE ({t1 - t0:.2f} s)")
c.execute("FLUSH")
n = c.execute("SELECT sum(n) FROM v").fetchone()[0]
total = c.execute("SELECT count(*) FROM t").fetchone()[0]
assert n == total, (n, total)
during.sort()
rss = int(open(f"/proc/{server.pid}/status").read().split("VmHWM:")[1].split()[0]) // 1024
print(f"{os.path.basename(os.path.dirname(binary))}: rows {rows} create {create:.2f} s; "
      f"writes during it {len(during)}, p50 {during[len(during)//2]*1000:.1f} ms, max {during[-1]*1000:.0f} ms; peak RSS {rss} MB")
server.terminate(); server.wait()
shutil.rmtree(data, ignore_errors=True)
