/* Recall's pages: the little they do in the browser. A file, not inline code,
   so that their Content-Security-Policy can refuse every inline script.
   The templates ask for it with data attributes:
     <form data-confirm="Question?">    submits only if the user agrees;
     <select data-autosubmit>           submits its form when picked with a pointer;
     <input data-checks="radio-id">     ticks that radio button when focused;
     <section data-refreshing="3">      reloads the page after that many seconds. */
"use strict";

document.addEventListener("submit", function (event) {
  var question = event.target.getAttribute("data-confirm");
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});

// A pick with the pointer submits at once. Arrow keys on a closed select
// change it too, one option per press: those changes wait for the form's
// own button, so a keyboard can step through the options (WCAG 3.2.2).
document.addEventListener("keydown", function (event) {
  if (event.target.tagName === "SELECT" && event.target.hasAttribute("data-autosubmit")) {
    event.target.dataset.keyed = "1";
  }
});

document.addEventListener("pointerdown", function (event) {
  if (event.target.hasAttribute && event.target.hasAttribute("data-autosubmit")) {
    delete event.target.dataset.keyed;
  }
});

document.addEventListener("change", function (event) {
  var select = event.target;
  if (select.hasAttribute("data-autosubmit") && !select.dataset.keyed) {
    select.form.submit();
  }
});

document.addEventListener("focusin", function (event) {
  var radio = event.target.getAttribute("data-checks");
  if (radio) {
    document.getElementById(radio).checked = true;
  }
});

document.querySelectorAll("[data-refreshing]").forEach(function (element) {
  var seconds = Number(element.getAttribute("data-refreshing"));
  window.setTimeout(function () { window.location.reload(); }, seconds * 1000);
});
