package testcluster

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/wire"
)

// Enqueues made through the followers while the leader shuts down without
// handing its leadership over (as after a failed hand-over) are not
// answered 503 shutdown_draining, which tells a client that the message
// may have been enqueued, nor not_leader: the followers take what the
// closing leader refused to the next leader. Only an enqueue whose answer
// the closing leader's connection cut may fail, as of an unknown outcome.
func TestEnqueuesThroughFollowersWhileTheLeaderStopsReachTheNextLeader(t *testing.T) {
	c := Start(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	fs := others(c, leader)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	refused, failed := map[string]int{}, map[string]int{}
	applied := 0
	for w := 0; w < 6; w++ {
		producer := c.Client(fs[w%len(fs)])
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := producer.Enqueue(ctx, wire.EnqueueRequest{Queue: "q"}, []byte("m"))
				cancel()
				mu.Lock()
				switch {
				case errors.Is(err, errcode.ShuttingDown), errors.Is(err, errcode.NotLeader):
					refused[err.Error()]++
				case err != nil:
					failed[err.Error()]++
				default:
					applied++
				}
				mu.Unlock()
			}
		}()
	}
	appliedAtLeast := func(n int) func() bool {
		return func() bool { mu.Lock(); defer mu.Unlock(); return applied >= n }
	}
	testutil.WaitFor(t, 20*time.Second, "enqueues through the followers", appliedAtLeast(50))
	c.Stop(leader)
	mu.Lock()
	stopped := applied
	mu.Unlock()
	testutil.WaitFor(t, 20*time.Second, "enqueues under the next leader", appliedAtLeast(stopped+50))
	close(stop)
	wg.Wait()
	if len(refused) > 0 {
		t.Fatalf("enqueues through the followers were answered %v (%d applied, other failures %v)", refused, applied, failed)
	}
	t.Logf("%d enqueues applied; failed: %v", applied, failed)
}
