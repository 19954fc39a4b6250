/* The RPC layer's marshal table (transport.h, "Framing"; marshal.c). */
#ifndef SR_RPC_MARSHAL_H
#define SR_RPC_MARSHAL_H

#include "transport.h"

extern const struct sr_tport_marshal sr__rpc_marshal;

#endif
