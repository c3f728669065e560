package sinks

import "github.com/outbox-relay/outbox-relay/sinks/wire"

// HeaderProducer is the application header in which the relay names the
// outbox a message comes from (relay.Config.Producer), in every message's
// Headers unless the application set it itself. A message's position
// (Seq) is that outbox's row id, comparable only with the positions of
// the same outbox: a consumer of several outboxes keeps its order per
// producer and key (package inbox reads this header). Sinks carry it like
// any header; one whose wire format carries no headers drops it with the
// relay's other metadata.
const HeaderProducer = wire.Producer
