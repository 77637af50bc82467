# Shortcuts for the checks .ci/run also runs, and the longer runs it leaves out.

.PHONY: test ci lincheck docker-test bench bench-cluster

test:           ## the README's test command
	go test -race ./...

ci:             ## everything CI runs
	.ci/run

lincheck:       ## 200 randomized fault schedules (CI runs 20); SEED=n reruns one
	RAFTLOCKD_LIN_SCHEDULES=$${SCHEDULES:-200} $(if $(SEED),RAFTLOCKD_LIN_SEED=$(SEED)) \
		go test -race -count=1 -timeout 3h -v -run TestLinearizabilityUnderFaults ./internal/lincheck

docker-test:    ## the compose cluster under faults (needs a Docker engine)
	scripts/docker-build.sh
	go test -count=1 -v -timeout 15m ./e2e/

bench:          ## single node, in process
	go run ./cmd/raftlockd bench --embedded --workload lock,handoff --clients 1,8,64 --duration 10s

bench-cluster:  ## three spawned nodes on loopback, with leader failover rounds
	go run ./cmd/raftlockd bench --spawn 3 --workload lock,handoff --clients 1,8,64 --duration 10s --failover-rounds 10
