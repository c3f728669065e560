package main

// VisibilitySeconds is every queue's visibility timeout: a message
// received and not deleted (a read-back whose answer was lost on the way)
// is visible again this many seconds later, give or take goaws's
// one-second sweep. throwaway.GoAWS.Take relies on it.
const VisibilitySeconds = 5
