// Hocuspocus, as users run it for production Yjs: the server alone, documents in memory, no
// extensions (so it persists nothing), on 127.0.0.1 at the port given. Prints
// "listening on PORT" once it accepts connections.

import { Server } from '@hocuspocus/server'

const port = Number(process.argv[2] || process.env.PORT || 1234)
const server = new Server({ port, address: '127.0.0.1', quiet: true, stopOnSignals: true })
await server.listen()
console.log(`listening on ${port}`)
