import { defineConfig } from 'vitest/config'

// Everything is bundled: the app makes no request outside its own origin.
export default defineConfig({
  build: {
    outDir: 'dist',
    emptyOutDir: true,
    sourcemap: false,
    chunkSizeWarningLimit: 2000,
    assetsInlineLimit: 0,
  },
  server: {
    // `npm run dev` against a local `coderoom serve`.
    proxy: { '/api': { target: 'http://127.0.0.1:8080', ws: true } },
  },
  test: {
    include: ['src/**/*.test.ts'],
    environment: 'node',
  },
})
