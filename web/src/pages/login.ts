// Log in: an email, then the 6-digit code sent to it.

import { api, ApiError } from '../api'
import type { App } from '../main'
import { errorText, h, replace } from '../dom'

/** Runs `run` on submit with the submit button disabled; a failure's message goes to `error`
 *  (through `explain`, which may reword it). */
function onSubmit (form: HTMLFormElement, error: HTMLElement, run: () => Promise<void>, explain = errorText): void {
  form.addEventListener('submit', async (e) => {
    e.preventDefault()
    error.textContent = ''
    const button = form.querySelector('button[type=submit]') as HTMLButtonElement
    button.disabled = true
    try {
      await run()
    } catch (err) {
      error.textContent = explain(err)
    } finally {
      button.disabled = false
    }
  })
}

export function loginPage (app: App, next: string): () => void {
  const error = h('p', { class: 'error', role: 'alert' })
  const card = h('section', { class: 'card narrow' })
  replace(app.main, card)

  const askEmail = (): void => {
    const email = h('input', { type: 'email', name: 'email', required: true, autocomplete: 'email', placeholder: 'you@example.com', 'aria-label': 'Email' })
    const form = h('form', { class: 'stack' },
      h('h1', null, 'Log in to Coderoom'),
      h('label', null, 'Email', email),
      h('button', { type: 'submit', class: 'primary' }, 'Send me a code'),
      error)
    onSubmit(form, error, async () => {
      await api.requestCode(email.value.trim())
      askCode(email.value.trim())
    })
    replace(card, form)
    email.focus()
  }

  let tick: ReturnType<typeof setInterval> | null = null
  const stopTick = (): void => { if (tick) clearInterval(tick); tick = null }

  const askCode = (address: string): void => {
    // No maxlength or pattern: a pasted "123 456" or "123-456" must arrive whole.
    const code = h('input', {
      name: 'code', inputmode: 'numeric', required: true,
      autocomplete: 'one-time-code', placeholder: '123456', 'aria-label': 'Code',
    })
    const sent = h('p', { class: 'hint', role: 'status', 'data-testid': 'code-sent' })
    const resend = h('button', { type: 'button', class: 'link', 'data-testid': 'resend-code' }, 'Send a new code')
    // A new code may be asked for RESEND_WAIT_S after the last one (or when the server's
    // Retry-After says); the button counts down until then.
    let readyAt = Date.now() + RESEND_WAIT_S * 1000
    const showResend = (): void => {
      const left = Math.ceil((readyAt - Date.now()) / 1000)
      resend.disabled = left > 0
      resend.textContent = left > 0 ? `Send a new code (in ${left} s)` : 'Send a new code'
    }
    stopTick()
    tick = setInterval(showResend, 1000)
    showResend()
    resend.addEventListener('click', async () => {
      if (resend.disabled) return
      resend.disabled = true
      error.textContent = ''
      try {
        await api.requestCode(address)
        readyAt = Date.now() + RESEND_WAIT_S * 1000
        sent.textContent = `A new code is on its way to ${address}. Use the newest one.`
      } catch (err) {
        if (err instanceof ApiError && err.retryAfterS !== null) readyAt = Date.now() + err.retryAfterS * 1000
        error.textContent = errorText(err)
      }
      showResend()
    })
    const form = h('form', { class: 'stack' },
      h('h1', null, 'Check your email'),
      h('p', null, 'We sent a 6-digit code to ', h('strong', null, address), '. It works once, for 10 minutes.'),
      h('p', { class: 'hint' }, 'Running locally without SMTP? The mail is in the server\'s outbox (DATA_DIR/outbox), and a log line says where.'),
      h('label', null, 'Code', code),
      h('button', { type: 'submit', class: 'primary' }, 'Log in'),
      h('div', { class: 'row' }, resend, h('button', { type: 'button', class: 'link', onclick: () => { stopTick(); askEmail() } }, 'Use another email')),
      sent,
      error)
    onSubmit(form, error, async () => {
      const digits = normalizeCode(code.value)
      if (digits === null) throw new ApiError(0, 'The code is the 6 digits in the mail.')
      await api.verify(address, digits)
      stopTick()
      app.me = await api.me()
      app.go(next)
    }, (err) => {
      code.select()
      return err instanceof ApiError && err.status === 401
        ? 'That code is wrong or expired. Check the latest mail, or ask for a new code.'
        : errorText(err)
    })
    replace(card, form)
    code.focus()
  }

  askEmail()
  return stopTick
}

/** Seconds before a new code may be asked for: the server issues one code per address a
 *  minute (and says how long to wait, in Retry-After, when asked sooner). */
const RESEND_WAIT_S = 60

/** The 6 digits of a typed or pasted code ("123 456", "123-456", " 123456 "), or null. */
export function normalizeCode (raw: string): string | null {
  const digits = raw.replace(/[\s-]/g, '')
  return /^[0-9]{6}$/.test(digits) ? digits : null
}
