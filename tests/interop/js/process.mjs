// The official E2B JavaScript SDK's command and PTY calls against a loopback service.
// Usage: node process.mjs <service url> <api key>; prints one JSON line of results.
import { Sandbox } from 'e2b'

const [url, apiKey] = process.argv.slice(2)
const opts = { apiKey, apiUrl: url, sandboxUrl: url, requestTimeoutMs: 10000 }
const results = {}
const check = (name, ok) => { results[name] = Boolean(ok) }
const encoder = new TextEncoder()
const decoder = new TextDecoder()

// Resolves once `text` shows up in what a PTY printed (false after 20 s).
function terminalOutput () {
  let seen = ''
  const waiters = []
  return {
    onData: (bytes) => {
      seen += decoder.decode(bytes)
      for (const w of waiters.splice(0)) if (!w(seen)) waiters.push(w)
    },
    waitFor: (text) => new Promise((resolve) => {
      const timer = setTimeout(() => resolve(false), 20000)
      const w = (all) => { if (all.includes(text)) { clearTimeout(timer); resolve(true); return true } return false }
      if (!w(seen)) waiters.push(w)
    }),
  }
}

async function errorName (call) {
  try { await call() } catch (e) { return e.constructor.name }
  return ''
}

const sandbox = await Sandbox.create({ ...opts, timeoutMs: 120000 })
try {
  const reader = await sandbox.commands.run('read line; echo got:$line', { background: true, stdin: true })
  await sandbox.commands.sendStdin(reader.pid, 'hello\n')
  check('commands.sendStdin', (await reader.wait()).stdout === 'got:hello\n')

  const cat = await sandbox.commands.run('cat; echo done', { background: true, stdin: true })
  await cat.sendStdin('a\n')
  await cat.closeStdin()
  check('commands.closeStdin', (await cat.wait()).stdout === 'a\ndone\n')

  const waiting = await sandbox.commands.run('read x; echo after:$x', { background: true, stdin: true })
  const attached = await sandbox.commands.connect(waiting.pid)
  await sandbox.commands.sendStdin(waiting.pid, 'go\n')
  check('commands.connect', (await attached.wait()).stdout === 'after:go\n')
  check('commands.connect unknown pid is NotFoundError',
    (await errorName(() => sandbox.commands.connect(999999))) === 'NotFoundError')

  const sleeper = await sandbox.commands.run('sleep 30', { background: true, envs: { A: '1' }, cwd: '/tmp' })
  const listed = (await sandbox.commands.list()).find((p) => p.pid === sleeper.pid)
  check('commands.list', listed && listed.cmd === '/bin/bash' && listed.envs.A === '1' && listed.cwd === '/tmp')
  check('commands.kill', (await sandbox.commands.kill(sleeper.pid)) === true)
  const killed = await errorName(() => sleeper.wait())
  check('commands.kill ends with CommandExitError', killed === 'CommandExitError')

  check('commands.run cwd /tmp', (await sandbox.commands.run('pwd', { cwd: '/tmp' })).stdout === '/tmp\n')
  check('commands.run unknown user is AuthenticationError',
    (await errorName(() => sandbox.commands.run('id', { user: 'mallory' }))) === 'AuthenticationError')
  check('commands.run user root is uid 0',
    (await sandbox.commands.run('id -u', { user: 'root' })).stdout === '0\n')
  check('commands.run user root starts in /root',
    (await sandbox.commands.run('pwd; echo "$HOME"', { user: 'root' })).stdout === '/root\n/root\n')
  const rootFile = await sandbox.files.write('/root/js.txt', 'from js', { user: 'root' })
  const rootOwner = (await sandbox.commands.run('stat -c %U /root/js.txt', { user: 'root' })).stdout
  check('files.write user root', rootFile.path === '/root/js.txt' && rootOwner === 'root\n')
  check('files.read user root', (await sandbox.files.read('/root/js.txt', { user: 'root' })) === 'from js')

  const out = terminalOutput()
  const terminal = await sandbox.pty.create({ cols: 80, rows: 24, onData: out.onData })
  await sandbox.pty.sendInput(terminal.pid, encoder.encode('stty size; echo $TERM\n'))
  check('pty.create', await out.waitFor('24 80'))
  check('pty.sendInput', await out.waitFor('xterm-256color'))
  await sandbox.pty.resize(terminal.pid, { cols: 120, rows: 40 })
  await sandbox.pty.sendInput(terminal.pid, encoder.encode('stty size\n'))
  check('pty.resize', await out.waitFor('40 120'))
  const second = terminalOutput()
  await sandbox.pty.connect(terminal.pid, { onData: second.onData })
  await sandbox.pty.sendInput(terminal.pid, encoder.encode('echo at-$((6*7))\n'))
  check('pty.connect', await second.waitFor('at-42'))
  check('pty.kill', (await sandbox.pty.kill(terminal.pid)) === true)
  const ended = await errorName(() => terminal.wait())
  check('pty.kill ends the terminal', ended === 'CommandExitError' && (await sandbox.pty.kill(terminal.pid)) === false)
} finally {
  await sandbox.kill()
}
console.log(JSON.stringify(results))
