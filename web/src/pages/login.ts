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

  const askCode = (address: string): void => {
    const code = h('input', {
      name: 'code', inputmode: 'numeric', pattern: '[0-9]{6}', maxlength: 6, required: true,
      autocomplete: 'one-time-code', placeholder: '123456', 'aria-label': 'Code',
    })
    const form = h('form', { class: 'stack' },
      h('h1', null, 'Check your email'),
      h('p', null, 'We sent a 6-digit code to ', h('strong', null, address), '. It works once, for 10 minutes.'),
      h('p', { class: 'hint' }, 'Running locally without SMTP? The mail is in the server\'s outbox (DATA_DIR/outbox), and a log line says where.'),
      h('label', null, 'Code', code),
      h('button', { type: 'submit', class: 'primary' }, 'Log in'),
      h('button', { type: 'button', class: 'link', onclick: askEmail }, 'Use another email'),
      error)
    onSubmit(form, error, async () => {
      await api.verify(address, code.value.trim())
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
  return () => {}
}
