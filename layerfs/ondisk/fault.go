package ondisk

// FaultPoint is called at every step that changes durable state (each
// write, rename, unmount, removal and copied entry). It does nothing in
// production; the crash tests set it to kill the process at the Nth step,
// which is how they prove that a crash at any instant is recoverable.
var FaultPoint = func() {}
