#!/usr/bin/env bash
# Measures raftlockd side by side with etcd and writes docs/BENCHMARKS.md.
#
#   scripts/bench.sh            (make bench)
#
# Installs etcd-server with apt-get when no etcd binary is on PATH (as root),
# builds raftlockd, starts a 3-node raftlockd cluster and a 3-member etcd
# cluster on loopback with their data on the same disk, runs every workload
# against both alternately, times leader failovers of both, profiles a
# raftlockd leader under the workloads the goals are about, and writes the
# document. About ten minutes on two cores. Settings (environment):
#
#   ROUNDS=2  DURATION=8s  WARMUP=2s  FAILOVER_ROUNDS=5
#   RUNS="lock=1,64 handoff=8 ..."   the rows (workload=clients,...)
#   OUT=docs/BENCHMARKS.md
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$HOME/go/bin:$PATH"

ROUNDS="${ROUNDS:-2}"
DURATION="${DURATION:-8s}"
WARMUP="${WARMUP:-2s}"
FAILOVER_ROUNDS="${FAILOVER_ROUNDS:-5}"
RUNS="${RUNS:-lock=1,64 handoff=8 xa-commit=1,8 queue=1,8 public-read=1,64 put=1,64}"
PROFILE_RUNS="lock=1,64 handoff=8"
UTXO_RUNS="${UTXO_RUNS:-utxo-spend=1,64 utxo-create=1,64}"
BLOCK_RUNS="${BLOCK_RUNS:-1000x100,10000x10}"
OUT="${OUT:-docs/BENCHMARKS.md}"

if ! command -v etcd >/dev/null; then
  echo "--- installing etcd-server"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/raftlockd-benchdoc-XXXXXX")"
trap 'rm -rf "$work"' EXIT
echo "--- building raftlockd"
go build -o "$work/raftlockd" ./cmd/raftlockd
bin="$work/raftlockd"
start=$(date +%s)

# show ARGS...: the command line as the document prints it, with the
# temporary directory written as $WORK and arguments holding spaces quoted.
show() {
  local out="raftlockd" a
  for a in "$@"; do
    a="${a//$work/\$WORK}"
    case "$a" in *" "*) a="\"$a\"" ;; esac
    out+=" $a"
  done
  printf '%s' "$out"
}

# Synchronous 4 KiB writes where the clusters keep their data: what one
# fsync'ed log append costs on this disk.
# The CPU time dd itself spends (user + system) is what such a write costs
# the writing process.
TIMEFORMAT='%U %S'
{ time dd if=/dev/zero of="$work/fsync.probe" bs=4k count=500 oflag=dsync 2>"$work/dd.txt" >/dev/null; } 2>"$work/ddtime.txt" || true
rm -f "$work/fsync.probe"
dsync_secs="$(sed -nE 's/.* copied, ([0-9.]+) s.*/\1/p' "$work/dd.txt")"
fsync_ms="$(awk -v s="${dsync_secs:-0}" 'BEGIN { if (s > 0) printf "%.2f", s * 1000 / 500; else printf "?" }')"
fsync_cpu_ms="$(awk '{ printf "%.2f", ($1 + $2) * 1000 / 500 }' "$work/ddtime.txt" 2>/dev/null || echo '?')"

compare=(bench --spawn 3 --peer etcd --dir "$work" --rounds "$ROUNDS" --runs "$RUNS" --duration "$DURATION"
  --warmup "$WARMUP" --failover-rounds "$FAILOVER_ROUNDS")
echo "--- side by side: $(show "${compare[@]}")"
"$bin" "${compare[@]}" --format markdown --goals-out "$work/missed.txt" >"$work/compare.md"

# etcd's failover with election timing as short as raftlockd's spawned
# clusters use (raftlockd's Raft timeouts are 200ms there, etcd's defaults
# 100ms heartbeat / 1s election), so the document shows both.
tuned=(bench --spawn 3 --peer etcd --dir "$work" --runs "put=1" --duration 1s --warmup 0s
  --etcd-heartbeat 40ms --etcd-election-timeout 200ms --failover-rounds "$FAILOVER_ROUNDS")
echo "--- failover with etcd's election timing matched: $(show "${tuned[@]}")"
"$bin" "${tuned[@]}" --format table >"$work/tuned.txt"

# UTXO records: raftlockd only (etcd has no equivalent).
utxo=(bench --spawn 3 --dir "$work" --rounds "$ROUNDS" --runs "$UTXO_RUNS" --duration "$DURATION" --warmup "$WARMUP")
echo "--- utxo: $(show "${utxo[@]}")"
"$bin" "${utxo[@]}" --format table >"$work/utxo.txt"

# Blocks: one chain applied in order, on one node and on three.
blocks1=(bench --embedded --blocks "$BLOCK_RUNS")
echo "--- blocks, one node: $(show "${blocks1[@]}")"
"$bin" "${blocks1[@]}" --format table >"$work/blocks1.txt"
blocks3=(bench --spawn 3 --dir "$work" --blocks "$BLOCK_RUNS")
echo "--- blocks, three nodes: $(show "${blocks3[@]}")"
"$bin" "${blocks3[@]}" --format table >"$work/blocks3.txt"

profile=(bench --spawn 3 --dir "$work" --runs "$PROFILE_RUNS" --duration "$DURATION" --warmup "$WARMUP"
  --server-profile "$work/prof")
echo "--- profiles: $(show "${profile[@]}")"
"$bin" "${profile[@]}" --format table >"$work/profile.txt"

elapsed=$(( $(date +%s) - start ))

# The machine and the versions.
cpu_model="$(sed -nE 's/^model name[[:space:]]*: (.*)/\1/p' /proc/cpuinfo | head -1)"
mem="$(awk '/^MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)"
disk="$(df -PT "$work" | awk 'NR == 2 { print $1 " (" $2 ")" }')"
go_version="$(go version | awk '{ print $3 }')"
etcd_version="$(etcd --version 2>/dev/null | sed -nE 's/^etcd Version: (.*)/\1/p')"
etcd_deb="$(dpkg-query -W -f '${Version}' etcd-server 2>/dev/null || echo 'not from a Debian package')"
etcd_client="$(go list -m -f '{{.Version}}' go.etcd.io/etcd/client/v3)"
describe="$(git describe --always --dirty 2>/dev/null || echo unknown)"

{
cat <<EOF
# Benchmarks: raftlockd side by side with etcd

Generated by \`scripts/bench.sh\` (\`make bench\`) on $(date -u '+%Y-%m-%d %H:%M UTC') in ${elapsed}s. Every figure
below comes from that one run; rerun the script to refresh the document.

## Machine

| | |
|---|---|
| CPU | $(nproc) cores, ${cpu_model:-unknown} |
| memory | ${mem} |
| disk | ${disk}; a synchronous 4 KiB write (\`dd oflag=dsync\`) takes ${fsync_ms} ms, ${fsync_cpu_ms} ms of it on the CPU |
| kernel | $(uname -sr) |

## Versions

| | |
|---|---|
| raftlockd | \`${describe}\` |
| Go | ${go_version} |
| etcd server | ${etcd_version:-unknown} (Debian etcd-server ${etcd_deb}) |
| etcd Go client | go.etcd.io/etcd/client/v3 ${etcd_client} |

## Method

\`$(show "${compare[@]}")\`

(\$WORK: a temporary directory on the disk above, holding both clusters' data.)

- **Clusters.** Three \`raftlockd server\` processes and three \`etcd\` members, all on loopback, their
  data directories side by side under one temporary directory on the disk above. Both serve clients and
  peers over mutual TLS with certificates of a CA made for the run. raftlockd's spawned nodes use 200 ms
  Raft heartbeat and election timeouts; etcd runs with its defaults (heartbeat 100 ms, election 1 s)
  except where noted. Both clusters run throughout; the one not being measured is idle.
- **Alternation.** For each round, for each row, raftlockd runs and then etcd (A B A B ...), ${ROUNDS}
  rounds; a row's figures combine its rounds (operations over total time; percentiles over all
  samples), and *ratio per round* shows the pairs separately, so a machine that slows down during
  the run shows up as spread rather than as a bias. Each run: ${WARMUP} warm-up (not measured), then
  ${DURATION} measured. Clients are spread over the three nodes (client *i* talks to node *i* mod 3) for
  both systems; the raftlockd client is the project's Go client (HTTP/1.1 connections), the etcd client
  \`go.etcd.io/etcd/client/v3\` (one gRPC connection per member).
- **ratio** is raftlockd's throughput over etcd's. **CPU** is servers + bench client, in cores (1.00:
  one core busy throughout), from the processes' CPU time over the measured phase; the machine has
  $(nproc).
- **ops/s** counts the operations that succeeded over the measured time (failed ones are the
  *errors*); **p50 / p99** are the latencies of those operations, interpolated linearly between the
  two samples around the percentile's rank.
- **Failover**: SIGKILL the leader, then write through a surviving node until a write is acknowledged;
  the time from the kill to that acknowledgement. raftlockd's write is an acquire, etcd's a put. The
  killed node is restarted and the cluster is healthy before the next round; the rounds alternate
  between the systems.

| workload | raftlockd (Go client) | etcd (clientv3 + concurrency) |
|---|---|---|
| lock | acquire, update with 256 B, release (commits the update); a key per client per cycle from 64 | \`Mutex.Lock\` on the worker's session (one etcd lease per worker, kept alive), \`Txn If(IsOwner) Then(Put 256 B)\`, \`Unlock\` |
| handoff | every client acquires ONE key (queued on the server) and releases it; ops are hand-offs | every client \`Lock\`s ONE \`Mutex\` (waits on its predecessor's key) and \`Unlock\`s it |
| xa-commit/1i | acquire two keys in one transaction, update both, release (one commit) | \`Lock\` two \`Mutex\`es, one \`Txn\` guarded by both \`IsOwner\`s writing both keys, \`Unlock\` both |
| queue | enqueue 256 B, dequeue (on another node), ack | \`Put\` of a unique key under the queue's prefix, \`Get\` of the oldest (\`WithFirstCreate\`, on another member), \`Txn If(ModRevision unchanged) Then(Delete)\` |
| public-read | \`GetPublic\` of a committed key (\`client get --public\`: linearizable, no lease) | \`Get\` (linearizable, etcd's default) |
| put | update of the client's key under a lease it holds for the run: raftlockd has no write without a lease, and this is its one-request replicated write (one Raft entry, acknowledged after commit; readers see the last value when the lease is released) | \`Put\` |

The lock workload is what the goals are about; put and public-read show the cost of one replicated
write and one linearizable read of each system, under the caveat above for put.

## raftlockd vs etcd

EOF
cat "$work/compare.md"
cat <<EOF

The reference figures are those the goals were set against; the goals' ratios use the etcd measured in
this run, alongside raftlockd, on the same machine at the same time.

Failover with etcd's election timing matched to raftlockd's (\`--etcd-heartbeat 40ms
--etcd-election-timeout 200ms\`; \`$(show "${tuned[@]}")\`):

EOF
grep '^failover' "$work/tuned.txt" | sed 's/^/- /'
cat <<EOF

## UTXO records (raftlockd only)

\`$(show "${utxo[@]}")\`

utxo-spend is a 2-input transaction: two outputs spent in one all-or-nothing \`/v1/utxo/spend\` (one Raft
entry); the parents are created by each client before its first measured operation. utxo-create
creates a transaction of two outputs (one record: one Raft entry). etcd has no equivalent workload.

\`\`\`
$(cat "$work/utxo.txt")
\`\`\`

For reference, a published run of Teranode's UTXO store interface on one large cloud node did about
13,300 spends/s and 17,700 creates/s with 512 requests in flight; the figures above are three
replicated nodes sharing $(nproc) cores and one disk, with 64 clients.

## Blocks (raftlockd only)

One chain of blocks of two-input, two-output transactions applied in order through
\`/v1/utxo/blocks/apply\` (each block is one atomic step; a 10,000-transaction block is staged in
chunks first), the last 5 blocks of each size rolled back one request per block and applied again,
while the leader prunes (the servers keep spent transactions 10 blocks and prune every 100 ms).
spends/s counts inputs spent; pruned/s is the pruner's rate while the blocks were applied.

One node: \`$(show "${blocks1[@]}")\`

\`\`\`
$(cat "$work/blocks1.txt")
\`\`\`

Three nodes sharing $(nproc) cores and one disk: \`$(show "${blocks3[@]}")\`

\`\`\`
$(cat "$work/blocks3.txt")
\`\`\`

Goals: 100 blocks of 1,000 transactions in about one second on one node (at least 100,000 spends/s
inside block apply) and 30,000 spends/s on three nodes.

## Missed goals and why

Profiles come from a separate run without etcd measurements, so that profiling does not slow the
figures above: \`$(show "${profile[@]}")\`. For each run the bench took a CPU profile of the Raft
leader over the measured phase (the servers serve \`/debug/pprof\` with \`--pprof\`) and read the
leader's Raft metrics (\`raftlockd_raft_propose_seconds\`, \`raftlockd_raft_log_store_seconds\`) before
and after. Figures of the profiled runs:

\`\`\`
$(cat "$work/profile.txt")
\`\`\`

EOF
if [ ! -s "$work/missed.txt" ]; then
  echo "Every goal was met."
fi
while IFS=$'\t' read -r prof goal; do
  echo "### ${goal}: missed"
  echo
  if [ "$prof" = "-" ]; then
    cat <<EOF
A CPU profile does not explain a failover time: it is the time the followers take to notice that the
leader is gone (up to twice the 200 ms election timeout, randomized), to elect one of them, and for
the new leader to commit the no-op of its term before it serves writes; plus the client's retry
after the connection to the dead leader fails. The failover rounds are listed above.
EOF
    echo
    continue
  fi
  if [ -f "$work/prof/$prof.txt" ]; then
    echo '```'
    cat "$work/prof/$prof.txt"
    echo '```'
    echo
    echo "\`go tool pprof -top -nodecount=15\` (flat: where the leader's CPU went):"
    echo
    echo '```'
    go tool pprof -top -nodecount=15 "$work/prof/$prof.pprof" 2>/dev/null | sed -n '/^Duration/,$p'
    echo '```'
    echo
    echo "\`go tool pprof -top -cum -nodecount=25\` (cumulative: which code paths):"
    echo
    echo '```'
    go tool pprof -top -cum -nodecount=25 "$work/prof/$prof.pprof" 2>/dev/null | sed -n '/^      flat/,$p'
    echo '```'
  else
    echo "No profile of ${prof} was taken (the profile run covers ${PROFILE_RUNS})."
  fi
  echo
done <"$work/missed.txt"
} >"$OUT"
echo "--- wrote $OUT (${elapsed}s of measurements)"
