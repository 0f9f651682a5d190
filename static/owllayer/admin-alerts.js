/* The counts in every admin page's header (templates/admin/base_site.html):
   live sessions waiting for a person and approvals waiting for an operator,
   in the tenants the user may see. They are read again every
   data-every-seconds, so a page left open stays current without a reload.
   When a count rises and the browser lets this site notify, a notification
   says so; all carry one tag, so several open admin tabs replace each
   other's notification rather than pile them up. */
(function () {
  "use strict";
  const badge = document.getElementById("alert-counts");
  if (badge === null) {
    return;
  }
  const waitingLink = document.getElementById("alert-waiting");
  const approvalsLink = document.getElementById("alert-approvals");
  const permissionButton = document.getElementById("alert-permission");
  const everyMs = (Number(badge.dataset.everySeconds) || 5) * 1000;
  const canNotify = "Notification" in window;
  let last = null;

  function waitingText(count) {
    return count + " waiting for a person";
  }

  function approvalsText(count) {
    return count + (count === 1 ? " approval waiting" : " approvals waiting");
  }

  function show(counts) {
    waitingLink.textContent = waitingText(counts.waiting);
    approvalsLink.textContent = approvalsText(counts.approvals);
    waitingLink.classList.toggle("alert-active", counts.waiting > 0);
    approvalsLink.classList.toggle("alert-active", counts.approvals > 0);
    badge.classList.toggle("alert-quiet", counts.waiting === 0 && counts.approvals === 0);
    badge.hidden = false;
  }

  function notifyIfRisen(counts) {
    // The first read only says where things stand: nothing rose yet.
    if (last === null || !canNotify || Notification.permission !== "granted") {
      return;
    }
    const morePeople = counts.waiting > last.waiting;
    if (!morePeople && counts.approvals <= last.approvals) {
      return;
    }
    const notification = new Notification("OwlLayer admin", {
      body: waitingText(counts.waiting) + " · " + approvalsText(counts.approvals),
      tag: "owllayer-alert-counts",
    });
    const url = morePeople ? counts.live_url : counts.approvals_url;
    notification.addEventListener("click", function () {
      window.focus();
      window.location.assign(url);
      notification.close();
    });
  }

  function readLater() {
    window.setTimeout(read, everyMs);
  }

  function read() {
    fetch(badge.dataset.url, {headers: {Accept: "application/json"}, credentials: "same-origin"})
      .then(function (answer) {
        // Signed out: the admin's login page answered. Asking again changes nothing.
        if (answer.redirected) {
          return null;
        }
        if (!answer.ok) {
          throw new Error("alert counts: " + answer.status);
        }
        return answer.json();
      })
      .then(function (counts) {
        if (counts === null) {
          return;
        }
        notifyIfRisen(counts);
        show(counts);
        last = counts;
        // For the page under the header: the live list reads its rows again.
        document.dispatchEvent(new CustomEvent("owllayer:alert-counts", {detail: counts}));
        readLater();
      })
      // The server restarting, or the network gone for a moment: the counts
      // stay as last read until an answer comes.
      .catch(readLater);
  }

  function offerPermission() {
    permissionButton.hidden = !(canNotify && Notification.permission === "default");
  }

  permissionButton.addEventListener("click", function () {
    Notification.requestPermission().then(offerPermission);
  });
  offerPermission();
  read();
})();
