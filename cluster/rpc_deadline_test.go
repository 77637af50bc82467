package cluster

import (
	"testing"
	"time"
)

// A forwarded request carries the time its caller had left, which the
// leader counts on its own clock: a follower whose wall clock is 10 s off
// does not make it fail at once (or wait past its caller's deadline). Its
// wall-clock deadline alone (a build that sends no time left) is still
// honoured.
func TestAForwardedDeadlineDoesNotDependOnTheFollowersClock(t *testing.T) {
	nodes := startStatic(t, 3)
	leader := leaderOf(t, nodes)
	svc := &rpcService{n: leader}
	skewed := time.Now().Add(-10 * time.Second).Add(5 * time.Second).UnixNano() // a follower 10 s behind, 5 s left
	var reply ReadIndexReply
	if err := svc.ReadIndex(ReadIndexArgs{Deadline: skewed, Timeout: int64(5 * time.Second)}, &reply); err != nil {
		t.Fatal(err)
	}
	if reply.Err != nil {
		t.Fatalf("a read forwarded with 5 s left failed on the leader: %v", reply.Err)
	}
	reply = ReadIndexReply{}
	if err := svc.ReadIndex(ReadIndexArgs{Deadline: time.Now().Add(5 * time.Second).UnixNano()}, &reply); err != nil || reply.Err != nil {
		t.Fatalf("a read forwarded by an older build: %v %v", err, reply.Err)
	}
}
