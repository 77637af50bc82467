package cluster

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
)

// A command raft refused without proposing it (the server no longer led,
// or was handing its leadership over) is proposed again, or answered
// not_leader to the follower that forwarded it, which sends it to the
// leader again. One raft took into its log and then lost with the
// leadership (ErrLeadershipLost) may still commit under the next leader:
// it is proposed once and answered unavailable, as of an unknown outcome,
// never not_leader.
func TestOnlyCommandsRaftNeverTookAreProposedAgain(t *testing.T) {
	n := open(t, testConfig(t.TempDir(), "boot-a"))
	defer n.Close()
	leaderOf(t, []*Node{n})
	real := n.packer.send
	defer func() { n.packer.send = real }()
	type outcome struct {
		proposals int32  // how many times raft is handed the command
		code      string // the error's code; "": applied
	}
	for _, tc := range []struct {
		fail             error
		local, forwarded outcome
	}{
		{raft.ErrNotLeader, outcome{2, ""}, outcome{1, errcode.NotLeader.Code}},
		{raft.ErrLeadershipTransferInProgress, outcome{2, ""}, outcome{2, ""}},
		{raft.ErrLeadershipLost, outcome{1, errcode.Unavailable.Code}, outcome{1, errcode.Unavailable.Code}},
	} {
		var sent atomic.Int32
		n.packer.send = func(data []byte, timeout time.Duration) (raft.Future, error) {
			if sent.Add(1) == 1 {
				return nil, n.raftErr(tc.fail)
			}
			return real(data, timeout)
		}
		check := func(via string, want outcome, err error) {
			t.Helper()
			var e *errcode.Error
			switch {
			case sent.Load() != want.proposals:
				t.Errorf("raft failing the first proposal %s with %q: proposed %d times, want %d (answered %v)",
					via, tc.fail, sent.Load(), want.proposals, err)
			case want.code == "" && err != nil:
				t.Errorf("raft failing the first proposal %s with %q: %v, want it proposed again", via, tc.fail, err)
			case want.code != "" && (!errors.As(err, &e) || e.Code != want.code || e.RetryAfter == 0):
				t.Errorf("raft failing the first proposal %s with %q: %v, want %s with retry_after_seconds", via, tc.fail, err, want.code)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := n.Propose(ctx, acquireCmd("local-"+tc.fail.Error()))
		cancel()
		check("made on the leader", tc.local, err)

		sent.Store(0)
		data, err := fsm.Encode(acquireCmd("forwarded-" + tc.fail.Error()))
		if err != nil {
			t.Fatal(err)
		}
		var reply ProposeReply
		if err := (&rpcService{n: n}).Propose(ProposeArgs{Command: data, Timeout: int64(5 * time.Second)}, &reply); err != nil {
			t.Fatal(err)
		}
		err = nil
		if e := reply.err(); e != nil {
			err = e
		}
		check("forwarded to the leader", tc.forwarded, err)
	}
}
