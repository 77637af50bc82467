# Shortcuts for the checks .ci/run also runs, and the longer runs it leaves out.

.PHONY: test ci fuzz lincheck docker-test bench bench-peer bench-embedded bench-cluster bench-xa

test:           ## the README's test command
	go test -race -p 1 -timeout 20m ./...

ci:             ## everything CI runs
	.ci/run

fuzz:           ## every fuzz target for FUZZTIME each (CI: 10s)
	scripts/fuzz.sh $${FUZZTIME:-1m}

lincheck:       ## 200 randomized fault schedules (CI runs 20); SEED=n reruns one
	RAFTLOCKD_LIN_SCHEDULES=$${SCHEDULES:-200} $(if $(SEED),RAFTLOCKD_LIN_SEED=$(SEED)) \
		go test -race -count=1 -timeout 3h -v -run TestLinearizabilityUnderFaults ./internal/lincheck

docker-test:    ## the compose cluster under faults (needs a Docker engine)
	scripts/docker-build.sh
	go test -count=1 -v -timeout 15m ./e2e/

bench:          ## raftlockd vs etcd (installs etcd-server if missing); writes docs/BENCHMARKS.md (~10 min)
	scripts/bench.sh

bench-peer:     ## raftlockd vs etcd, 3 nodes each on loopback: the table only
	go run ./cmd/raftlockd bench --spawn 3 --peer etcd --rounds 2 --runs "lock=1,64 handoff=8" --duration 10s --failover-rounds 3

bench-embedded: ## single node, in process
	go run ./cmd/raftlockd bench --embedded --runs "lock=1,8,64 handoff=8" --duration 10s

bench-cluster:  ## three spawned nodes on loopback, with leader failover rounds
	go run ./cmd/raftlockd bench --spawn 3 --runs "lock=1,8,64 handoff=8 queue=1,8" --duration 10s --failover-rounds 10

bench-xa:       ## two-key transactions on one island and across two
	go run ./cmd/raftlockd bench --embedded --islands 2 --workload xa-commit --clients 1,8 --duration 10s
	go run ./cmd/raftlockd bench --embedded --workload xa-commit --clients 1,8 --duration 10s
