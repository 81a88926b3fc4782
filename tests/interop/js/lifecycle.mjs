// The official E2B JavaScript SDK's pause, resume, metrics and watch calls against a loopback service.
// Usage: node lifecycle.mjs <service url> <api key>; prints one JSON line of results.
import { Sandbox, FilesystemEventType } from 'e2b'

const [url, apiKey] = process.argv.slice(2)
const opts = { apiKey, apiUrl: url, sandboxUrl: url, requestTimeoutMs: 10000 }
const results = {}
const check = (name, ok) => { results[name] = Boolean(ok) }
const within = (ms, promise) => Promise.race([
  promise, new Promise((_, reject) => setTimeout(() => reject(new Error('timed out')), ms)),
])

const sandbox = await Sandbox.create({ ...opts, metadata: { 'created-by': 'piship-js-life' } })
try {
  let seen
  const written = new Promise((resolve) => { seen = resolve })
  const handle = await sandbox.files.watchDir('', (event) => {
    if (event.name === 'watched.txt' && event.type === FilesystemEventType.WRITE) seen(true)
  })
  await sandbox.files.write('watched.txt', 'w')
  check('files.watchDir', await within(10000, written))
  await handle.stop()

  const metrics = await sandbox.getMetrics()
  check('getMetrics', metrics.length === 1 && metrics[0].cpuCount >= 1)

  await sandbox.files.write('kept.txt', 'kept')
  const started = await sandbox.commands.run(
    "nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/tick; sleep 0.05; done' >/dev/null 2>&1 & echo $!")
  const pid = started.stdout.trim()
  check('pause', (await sandbox.pause()) === true)
  check('pause again is false', (await Sandbox.pause(sandbox.sandboxId, opts)) === false)
  check('isRunning while paused', (await sandbox.isRunning()) === false)
  const paused = await Sandbox.list({ ...opts, query: { state: ['paused'] } }).nextItems()
  check('Sandbox.list paused', paused.length === 1 && paused[0].state === 'paused')
  check('getInfo paused', (await sandbox.getInfo()).state === 'paused')

  const resumed = await Sandbox.connect(sandbox.sandboxId, opts)
  check('Sandbox.connect resumes', (await resumed.getInfo()).state === 'running')
  check('files kept', (await resumed.files.read('kept.txt')) === 'kept')
  const alive = await resumed.commands.run(`kill -0 ${pid} && echo alive`)
  check('background process survives', alive.stdout === 'alive\n')
} finally {
  await sandbox.kill()
}

const pausing = await Sandbox.create({ ...opts, lifecycle: { onTimeout: 'pause' } })
try {
  const info = await pausing.getInfo()
  check('lifecycle onTimeout pause', info.lifecycle && info.lifecycle.onTimeout === 'pause')
  await pausing.files.write('kept.txt', 'kept')
  await pausing.setTimeout(0) // the timeout is reached now
  const deadline = Date.now() + 10000
  let state = info.state
  while (state !== 'paused' && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 50))
    state = (await pausing.getInfo()).state
  }
  check('timeout pauses', state === 'paused')
  const woken = await Sandbox.connect(pausing.sandboxId, opts)
  check('Sandbox.connect resumes the auto-paused', (await woken.files.read('kept.txt')) === 'kept')
} finally {
  await pausing.kill()
}
console.log(JSON.stringify(results))
