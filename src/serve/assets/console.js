// leasehold console: live polling of the page's live region.
//
// The region (#live, with data-live-src) is fetched every 2 s and replaced in
// place, keeping focus where it was. The button pauses and resumes; polling stops
// while the tab is hidden and resumes when it is shown; it ends for good when the
// server marks the region done (a finished attempt) or the session ends.
// document.documentElement.dataset.livePolls counts the fetches made.
(function () {
  'use strict';
  var live = document.getElementById('live');
  if (!live || !live.getAttribute('data-live-src')) return;
  var src = live.getAttribute('data-live-src');
  var toggle = document.getElementById('live-toggle');
  var status = document.getElementById('live-status');
  var root = document.documentElement;
  var paused = false, ended = false, timer = null, inflight = false, polls = 0;

  function say(text) { if (status) status.textContent = text; }
  function stop() { if (timer !== null) { clearInterval(timer); timer = null; } }
  function schedule() {
    stop();
    root.dataset.livePolling = 'false';
    if (ended || paused || document.visibilityState !== 'visible') return;
    timer = setInterval(tick, 2000);
    root.dataset.livePolling = 'true';
  }
  function end(text) { ended = true; stop(); root.dataset.livePolling = 'false'; if (toggle) toggle.disabled = true; say(text); }

  function tick() {
    if (inflight || ended || paused || document.visibilityState !== 'visible') return;
    inflight = true;
    polls += 1;
    root.dataset.livePolls = String(polls);
    fetch(src, { credentials: 'same-origin', headers: { 'Accept': 'text/html' } })
      .then(function (r) {
        if (r.redirected || r.status === 401 || r.status === 403) { end('Live updates stopped: the session ended. Reload the page to log in.'); return null; }
        if (!r.ok) throw new Error('HTTP ' + r.status);
        return r.text();
      })
      .then(function (html) {
        if (html === null) return;
        var focused = document.activeElement && live.contains(document.activeElement) ? document.activeElement.getAttribute('href') : null;
        live.innerHTML = html;
        if (focused) {
          var again = live.querySelector('[href="' + focused.replace(/"/g, '') + '"]');
          if (again) again.focus();
        }
        if (live.querySelector('[data-live-done]')) end('Live updates ended: the attempt is finished.');
        else say('Live: updated at ' + new Date().toLocaleTimeString());
      })
      .catch(function (e) { say('Live update failed (' + e.message + '); trying again in 2 s'); })
      .then(function () { inflight = false; });
  }

  if (toggle) {
    toggle.addEventListener('click', function () {
      paused = !paused;
      toggle.setAttribute('aria-pressed', paused ? 'true' : 'false');
      toggle.textContent = paused ? 'Resume live updates' : 'Pause live updates';
      say(paused ? 'Live updates paused' : 'Live: refreshing every 2 s');
      schedule();
    });
  }
  document.addEventListener('visibilitychange', function () {
    if (document.visibilityState === 'visible') { schedule(); if (!paused && !ended) tick(); }
    else { stop(); root.dataset.livePolling = 'false'; }
  });
  schedule();
})();
