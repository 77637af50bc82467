package fsm

import (
	"bytes"
	"encoding/json"

	"github.com/raftlockd/raftlockd/errcode"
)

// DropWaitsCmd withdraws every request that waits on server Node (queued
// acquires and dequeues) in a run other than Run. A server proposes it
// when it starts: a crash ended its previous run without withdrawing the
// requests waiting there, whose clients are gone, and a grant to one of
// them would hold the key (or lease the message) for nobody.
type DropWaitsCmd struct {
	Node string `json:"node"`
	Run  string `json:"run"`
}

func (s *applyState) dropWaits(c *DropWaitsCmd) *Result {
	if c.Node == "" || c.Run == "" || hasNUL(c.Node, c.Run) || tooLong(c.Node, c.Run) {
		return fail(errcode.MalformedCmd.With("drop_waits needs a node and its run"))
	}
	stale := func(node, run string) bool { return node == c.Node && run != c.Run }
	why := "the server the request waited on restarted"
	var keys [][]byte
	cur := s.b(bucketWaiters).Cursor()
	for k, v := cur.First(); k != nil; k, v = cur.Next() {
		var w Waiter
		if json.Unmarshal(v, &w) == nil && stale(w.Node, w.Run) {
			keys = append(keys, bytes.Clone(k))
		}
	}
	for _, wk := range keys {
		s.endWaiter(wk, errcode.Waiting.With("%s", why))
	}
	var queued []QueueWaiter
	var queuedKeys [][]byte
	cur = s.b(bucketQWaiters).Cursor()
	for k, v := cur.First(); k != nil; k, v = cur.Next() {
		var w QueueWaiter
		if json.Unmarshal(v, &w) == nil && stale(w.Node, w.Run) {
			queued, queuedKeys = append(queued, w), append(queuedKeys, bytes.Clone(k))
		}
	}
	for i, wk := range queuedKeys {
		s.removeQueueWaiter(wk, &queued[i])
		s.emit(Event{Kind: EventWaitEnded, RequestID: queued[i].RequestID, Err: errcode.QueueEmpty.With("%s", why)})
	}
	return &Result{Cancelled: len(keys)+len(queued) > 0}
}
