/* Recall's pages: the little they do in the browser. A file, not inline code,
   so that their Content-Security-Policy can refuse every inline script.
   The templates ask for it with data attributes:
     <form data-confirm="Question?">    submits only if the user agrees;
     <select data-autosubmit>           submits its form when changed;
     <input data-checks="radio-id">     ticks that radio button when focused;
     <section data-refreshing="3">      reloads the page after that many seconds. */
"use strict";

document.addEventListener("submit", function (event) {
  var question = event.target.getAttribute("data-confirm");
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});

document.addEventListener("change", function (event) {
  if (event.target.hasAttribute("data-autosubmit")) {
    event.target.form.submit();
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
