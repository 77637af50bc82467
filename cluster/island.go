package cluster

// Term returns the current Raft term: the fencing token of this island's
// coordinator in its requests to other islands.
func (n *Node) Term() uint64 { return n.raft.CurrentTerm() }

// BackendHash returns the island's backend hash ("" until the first leader
// has named the island).
func (n *Node) BackendHash() string { return n.fsm.BackendHash() }
