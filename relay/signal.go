package relay

// signalsForTests makes New give every relay a test-signal bus (see
// package testsig); only the package's tests set it.
var signalsForTests bool
